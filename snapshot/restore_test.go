package snapshot_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/snapshot"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// TestResume_Refuses: a node restoring from a snapshot that is gone, or that is another
// snapshot now, refuses to start and says what to put back — before it touches its bus.
func TestResume_Refuses(t *testing.T) {
	path, _ := mustSave(t, mustMesh(t))
	r, err := snapshot.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := r.ManifestSum()
	r.Close()
	noPhase := func(string) {}
	for _, c := range []struct {
		what string
		from genesis.Restoring
		says string
	}{
		{"a file gone", genesis.Restoring{File: filepath.Join(t.TempDir(), "gone.snap"), SHA256: sum}, "which is gone: put the file back"},
		{"another snapshot", genesis.Restoring{File: path, SHA256: "0123"}, "is another snapshot now"},
	} {
		f := &genesis.Foundation{MeshID: "mesh-1", Restoring: &c.from}
		err := snapshot.Resume(testContext(t), nil, t.TempDir(), f, nil, 1, noPhase, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Resume from %s: %v, want it to say %q", c.what, err, c.says)
		}
	}
	// Not restoring: nothing to do.
	if err := snapshot.Resume(testContext(t), nil, t.TempDir(), &genesis.Foundation{}, nil, 1, noPhase, nil); err != nil {
		t.Fatalf("Resume of a foundation that is not restoring: %v", err)
	}
}

// bus is a plain JetStream server as a restore sees a single node's bus.
type bus struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func (b bus) Conn() *nats.Conn               { return b.nc }
func (b bus) JetStream() jetstream.JetStream { return b.js }
func (b bus) Peers() map[string]bool         { return nil }
func (b bus) MetaLeader() string             { return "" }

// TestResume_Interrupted: a restore cut short after its first streams (kill -9) goes on at
// the next start — the streams restored whole kept, the rest restored — then begins the
// node's audit log with the restore and clears the mark; the snapshot file is unchanged.
func TestResume_Interrupted(t *testing.T) {
	path, man := mustSave(t, mustMesh(t))
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := snapshot.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := r.ManifestSum()
	r.Close()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "meshnode.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	g := genesis.New(db)
	vault, _ := nkeys.CreateUser()
	vaultSeed, _ := vault.Seed()
	f, err := g.Restore("alpha", 1, genesis.Restored{MeshID: "mesh-1", RouteSecret: []byte("r"), GossipKey: []byte("g"), BarrierKey: []byte("b"), VaultSeed: vaultSeed,
		From: genesis.Restoring{File: path, SHA256: sum, Created: man.Created}})
	if err != nil {
		t.Fatal(err)
	}
	fresh := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	nc, js := testbed.Connect(t, fresh)
	dataDir := t.TempDir()
	log := slog.New(slog.DiscardHandler)

	// Cut short as the third stream begins.
	ctx, cancel := context.WithCancel(testContext(t))
	var begun int
	err = snapshot.Resume(ctx, db, dataDir, f, bus{nc, js}, 1, func(string) {
		if begun++; begun == 3 {
			cancel()
		}
	}, log)
	if err == nil {
		t.Fatal("Resume cut short returned no error")
	}
	if kept, err := g.Foundation(); err != nil || kept.Restoring == nil {
		t.Fatalf("after a restore cut short the foundation is %+v (%v): want it still restoring", kept, err)
	}
	// The next start.
	var phases []string
	if err := snapshot.Resume(testContext(t), db, dataDir, f, bus{nc, js}, 1, func(p string) { phases = append(phases, p) }, log); err != nil {
		t.Fatal(err)
	}
	for _, s := range man.Streams {
		st, err := js.Stream(testContext(t), s.Name())
		if err != nil {
			t.Fatalf("stream %s after the resumed restore: %v", s.Name(), err)
		}
		if got := st.CachedInfo().State; got.Msgs != s.State.Msgs || got.LastSeq != s.State.LastSeq {
			t.Errorf("stream %s: %d messages to %d, want %d to %d", s.Name(), got.Msgs, got.LastSeq, s.State.Msgs, s.State.LastSeq)
		}
	}
	if last := phases[len(phases)-1]; !strings.HasSuffix(last, "KV_mesh-registry") {
		t.Errorf("the last stream restored is %q, want the registry (what founding nodes wait for)", last)
	}
	if kept, err := g.Foundation(); err != nil || kept.Restoring != nil || f.Restoring != nil {
		t.Fatalf("after the restore the foundation is %+v (%v): want the mark cleared", kept, err)
	}
	l, err := audit.New(db, nil, "alpha", nil, nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := l.Verify(); err != nil || v.Restored == nil || v.Restored.Snapshot != sum || v.Records != 1 {
		t.Fatalf("the audit log after the restore: %+v %v; want it to begin with the restore", v, err)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("the snapshot file changed (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "restore")); !os.IsNotExist(err) {
		t.Errorf("the unpacked snapshots are left in the data dir (%v)", err)
	}
}
