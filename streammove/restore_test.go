package streammove

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRestoreStream_Marked: a restore marks its stream until it is checked, so a start cut
// short between the two compares it again at the next: a marked stream like the snapshot
// (messages and durable consumers) is kept and unmarked, one unlike it is restored again;
// an unmarked one is kept as the mesh left it.
func TestRestoreStream_Marked(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	nc, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A mesh has other streams: with S its only one, nats-server removes the emptied
	// streams directory in the background after a delete, racing the restore that makes it
	// again (2.15.2).
	for _, name := range []string{"S", "other"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name[:1]) + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
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
	snap, err := snapshotToFile(ctx, nc, dir, "S")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(snap.Consumers, []string{"d"}) {
		t.Fatalf("the snapshot's consumers: %v, want [d]", snap.Consumers)
	}
	type state struct {
		msgs    uint64
		marked  bool
		created time.Time
		d       bool // consumer d is there
	}
	now := func() state {
		t.Helper()
		st, err := js.Stream(ctx, "S")
		if err != nil {
			t.Fatal(err)
		}
		info := st.CachedInfo()
		_, marked := info.Config.Metadata[RestoringMeta]
		_, err = st.Consumer(ctx, "d")
		return state{info.State.Msgs, marked, info.Created, err == nil}
	}
	mark := func() {
		t.Helper()
		st, err := js.Stream(ctx, "S")
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.Metadata = map[string]string{RestoringMeta: "true"}
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}

	// The next starts restore as the node does, again when an attempt fails: nats-server
	// removes a deleted stream's files in the background, and a restore of the same name at
	// once may find them half gone.
	log := slog.New(slog.NewTextHandler(t.Output(), nil))

	// A start cut short as its restore is answered leaves the stream marked.
	if err := js.DeleteStream(ctx, "S"); err != nil {
		t.Fatal(err)
	}
	cut := errors.New("cut short")
	restoredHook = func(string) error { return cut }
	t.Cleanup(func() { restoredHook = nil })
	_, err = restoreStream(ctx, nc, js, dir, snap, 1)
	restoredHook = nil
	if !errors.Is(err, cut) {
		t.Fatalf("restore cut short: %v", err)
	}
	restored := now()
	if restored.msgs != 3 || !restored.marked || !restored.d {
		t.Fatalf("after a restore cut short: %+v, want the snapshot's 3 messages and d, marked", restored)
	}
	// The next start finds it like the snapshot: kept, and unmarked.
	if _, err := Restore(ctx, log, nc, js, dir, snap, 1); err != nil {
		t.Fatal(err)
	}
	if got := now(); got.msgs != 3 || got.marked || !got.d || !got.created.Equal(restored.created) {
		t.Fatalf("a marked stream like the snapshot: %+v, want it kept (created %v) and unmarked", got, restored.created)
	}

	// Marked, with two messages the snapshot does not have: restored from the snapshot.
	publish(2)
	mark()
	if _, err := Restore(ctx, log, nc, js, dir, snap, 1); err != nil {
		t.Fatal(err)
	}
	if got := now(); got.msgs != 3 || got.marked || !got.d {
		t.Fatalf("a marked stream with more messages: %+v; want the snapshot's 3 and d, unmarked", got)
	}

	// Marked, without the snapshot's consumer (a restarting server drops a restored
	// consumer the mesh had not registered): restored again, the consumer with it.
	if err := js.DeleteConsumer(ctx, "S", "d"); err != nil {
		t.Fatal(err)
	}
	mark()
	if _, err := Restore(ctx, log, nc, js, dir, snap, 1); err != nil {
		t.Fatal(err)
	}
	if got := now(); got.msgs != 3 || got.marked || !got.d {
		t.Fatalf("a marked stream without its consumer: %+v; want d back, unmarked", got)
	}

	// A recorded consumer that never comes (gone for good) is given up once the stream is
	// whole for registerWait, and named: restoring again for it would go round for ever.
	wait := registerWait
	registerWait = 200 * time.Millisecond
	t.Cleanup(func() { registerWait = wait })
	ghostly := snap
	ghostly.Consumers = []string{"d", "ghost"}
	mark()
	lost, err := Restore(ctx, log, nc, js, dir, ghostly, 1)
	if err != nil || !slices.Equal(lost, []string{"ghost"}) {
		t.Fatalf("a consumer that never comes: lost %v, %v; want [ghost]", lost, err)
	}
	if got := now(); got.msgs != 3 || got.marked || !got.d {
		t.Fatalf("after giving a consumer up: %+v; want the snapshot's 3 and d, unmarked", got)
	}

	// Unmarked: what the mesh wrote since is kept, and a consumer it removed stays gone.
	publish(2)
	if err := js.DeleteConsumer(ctx, "S", "d"); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, log, nc, js, dir, snap, 1); err != nil {
		t.Fatal(err)
	}
	if got := now(); got.msgs != 5 || got.marked || got.d {
		t.Fatalf("an unmarked stream: %+v; want the 5 it holds and no d, unmarked", got)
	}
}

// TestRestoreStream_Unanswered: a JetStream request nobody answers (a server just restarted
// into the mesh drops one now and then) ends the attempt after apiWait with the step named,
// not when the attempt's minutes are up, so the next attempt asks again at once.
func TestRestoreStream_Unanswered(t *testing.T) {
	srv := testbed.NATSServer(t, nil)
	nc, js := testbed.Connect(t, srv)
	// A subscriber that takes every JetStream request and answers none.
	sub, err := nc.SubscribeSync("$JS.API.>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	wait := apiWait
	apiWait = 100 * time.Millisecond
	t.Cleanup(func() { apiWait = wait })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = restoreStream(ctx, nc, js, t.TempDir(), Stream{Config: server.StreamConfig{Name: "S"}}, 1)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "stream info") || ctx.Err() != nil {
		t.Fatalf("restore with nobody answering: %v (the attempt's context: %v); want the stream info request's own deadline", err, ctx.Err())
	}
	if m, err := sub.NextMsg(time.Second); err != nil || m.Subject != "$JS.API.STREAM.INFO.S" {
		t.Fatalf("the request nobody answered: %v %v", m, err)
	}
}
