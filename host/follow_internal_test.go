package host

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
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
