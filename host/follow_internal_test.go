package host

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// TestFollower_HoldsNow: a declaration at an older epoch than the applied one is taken only
// from the seat's holder now, at that epoch, composed after it took the lease — an epoch
// number a remade leases' bucket repeats does not revive a declaration composed before.
func TestFollower_HoldsNow(t *testing.T) {
	took := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	f := &Follower{cfg: Config{Holder: func() (string, uint64, time.Time, bool) { return "alpha", 3, took, true }}}
	for _, tc := range []struct {
		d    deploy.Declaration
		want bool
	}{
		{deploy.Declaration{Controller: "alpha", Epoch: 3, Composed: took.Add(time.Second)}, true},
		{deploy.Declaration{Controller: "alpha", Epoch: 3, Composed: took}, true},
		{deploy.Declaration{Controller: "alpha", Epoch: 3, Composed: took.Add(-time.Second)}, false}, // composed under an earlier lease of the same number
		{deploy.Declaration{Controller: "beta", Epoch: 3, Composed: took.Add(time.Second)}, false},
		{deploy.Declaration{Controller: "alpha", Epoch: 2, Composed: took.Add(time.Second)}, false},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond) // a refusal waits for the mirror until then
		if got := f.holdsNow(ctx, tc.d); got != tc.want {
			t.Errorf("holdsNow(%+v)=%v, want %v", tc.d, got, tc.want)
		}
		cancel()
	}
}

// TestFollower_WatchStuck: a follow that has not read the newest declaration stored for its
// node within a whole interval is said to be stuck (its ordered consumer was lost and not
// made again yet), one that has read it never is, and a STATE deleted under it is said to
// be gone.
func TestFollower_WatchStuck(t *testing.T) {
	_, js := testbed.Connect(t, testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: manifest.StateStreamName, Subjects: []string{manifest.StateSubject("*")}})
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for range 2 {
		ack, err := js.Publish(ctx, manifest.StateSubject("alpha"), []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	f := &Follower{cfg: Config{Node: "alpha"}, check: 20 * time.Millisecond}
	created := st.CachedInfo().Created

	var handled atomic.Uint64
	handled.Store(last - 1)
	if err := f.watchStuck(ctx, st, created, &handled); !errors.Is(err, errStuck) {
		t.Fatalf("a follow behind the stored declaration: %v, want it stuck", err)
	}

	handled.Store(last)
	quiet, stop := context.WithTimeout(ctx, 200*time.Millisecond) // ten intervals
	defer stop()
	if err := f.watchStuck(quiet, st, created, &handled); err != nil {
		t.Fatalf("a follow that read the newest declaration: %v, want it left alone", err)
	}

	if err := js.DeleteStream(ctx, manifest.StateStreamName); err != nil {
		t.Fatal(err)
	}
	if err := f.watchStuck(ctx, st, created, &handled); !errors.Is(err, errRemade) {
		t.Fatalf("a follow of a deleted STATE: %v, want it told", err)
	}
}

// TestFollower_CatchUp: a follow found stuck applies the node's newest declaration read
// straight from STATE, without waiting for its ordered consumer to be made again; one it has
// handled already is left alone.
func TestFollower_CatchUp(t *testing.T) {
	_, js := testbed.Connect(t, testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: manifest.StateStreamName, Subjects: []string{manifest.StateSubject("*")},
		MaxMsgsPerSubject: 1}) // as the mesh makes it: no direct gets
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	key, err := envelope.NewSigningKey(kp)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	servers := func(name string) (string, bool) { return pub, name == "ctl" }
	p := &deploy.Publisher{JS: js, Key: key, Controller: "ctl", Servers: servers}
	d, _, err := p.Publish(ctx, "alpha", 1, nil, deploy.Applied{})
	if err != nil {
		t.Fatal(err)
	}
	_, seq, _, err := deploy.Last(ctx, js, "alpha", servers)
	if err != nil {
		t.Fatal(err)
	}

	db, err := bolt.Open(filepath.Join(t.TempDir(), "node.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var applied []uint64
	f, err := Open(Config{Node: "alpha", DB: db, JS: js, Servers: servers, Event: func(string, map[string]any) {},
		Apply: func(_ context.Context, d deploy.Declaration) { applied = append(applied, d.Revision) }})
	if err != nil {
		t.Fatal(err)
	}
	f.catchUp(ctx, st, seq-1)
	if len(applied) != 1 || applied[0] != d.Revision || f.Applied().Revision != d.Revision {
		t.Fatalf("caught up: applied %v, the follower's %d; want revision %d once", applied, f.Applied().Revision, d.Revision)
	}
	f.catchUp(ctx, st, seq)
	if len(applied) != 1 {
		t.Errorf("a declaration the follow handled was applied again: %v", applied)
	}
}
