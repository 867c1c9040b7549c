package node

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRestoreStream_Marked: a stream still marked as restoring (a growth's start cut short
// between its restore and its check) is compared with the snapshot again, and restored
// again when it differs; an unmarked one is kept as the mesh left it.
func TestRestoreStream_Marked(t *testing.T) {
	srv, err := server.NewServer(&server.Options{JetStream: true, StoreDir: t.TempDir(), Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(n int) {
		for range n {
			if _, err := js.Publish(ctx, "s.x", []byte("m")); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(3)
	dir := t.TempDir()
	snap, err := snapshotStream(ctx, nc, dir, "S")
	if err != nil {
		t.Fatal(err)
	}
	state := func() (uint64, bool) {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, marked := info.Config.Metadata[restoringMeta]
		return info.State.Msgs, marked
	}

	// Marked, and two messages the snapshot does not have: restored from the snapshot.
	publish(2)
	cfg := st.CachedInfo().Config
	cfg.Metadata = map[string]string{restoringMeta: "true"}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := restoreStream(ctx, nc, js, dir, snap, 1); err != nil {
		t.Fatal(err)
	}
	if msgs, marked := state(); msgs != 3 || marked {
		t.Fatalf("a marked stream: %d messages, marked %v after the restore; want the snapshot's 3, unmarked", msgs, marked)
	}

	// Unmarked: what the mesh wrote since is kept.
	publish(2)
	if err := restoreStream(ctx, nc, js, dir, snap, 1); err != nil {
		t.Fatal(err)
	}
	if msgs, marked := state(); msgs != 5 || marked {
		t.Fatalf("an unmarked stream: %d messages, marked %v; want the 5 it holds, unmarked", msgs, marked)
	}
}
