//go:build integration

package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
)

// TestIntegration_ChaosCheckersCatch: the checkers fail on a live mesh when what they guard
// is taken out — not only on the synthetic histories of check_test.go. On three meshnode
// processes the workload runs with MutateUnfenced (the ledger's holders keep acting after
// they lose the seat, and the receiver accepts every effect); the node of the seat's holder
// is killed, so the other instance takes the seat in a greater epoch while the first goes
// on. Then an acked event is deleted from EVENTS, as a store that loses a write would. The
// fencing check must report the stale holder's effects, and the lost check the dropped event
// by its id.
func TestIntegration_ChaosCheckersCatch(t *testing.T) {
	c := StartCluster(t, Options{Servers: 3})
	h := NewHistory()
	log := slog.New(slog.NewTextHandler(&logSink{t: t}, &slog.HandlerOptions{Level: slog.LevelError}))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	w, err := StartWorkload(t, ctx, c, h, t.TempDir(), log, MutateUnfenced)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	// The holder's node, once the ledger has handled a job.
	var holder Op
	testbed.RetryUntil(t, time.Minute, func() error {
		var ok bool
		if holder, ok = lastAcquire(h.Ops()); !ok || !slices.ContainsFunc(h.Ops(), func(op Op) bool { return op.Kind == "handle" && op.OK }) {
			return fmt.Errorf("the ledger seat was not acquired and used yet")
		}
		return nil
	})
	at := slices.IndexFunc(c.Nodes, func(n *Node) bool { return n.Name() == holder.Value })
	if at < 0 {
		t.Fatalf("the ledger's holder %s is on node %q, not one of the cluster's", holder.Process, holder.Value)
	}
	if err := c.Nodes[at].Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed node %s, where %s held the ledger seat in epoch %d", holder.Value, holder.Process, holder.Epoch)
	// The other instance takes the seat in a greater epoch and handles a job.
	testbed.RetryUntil(t, 2*time.Minute, func() error {
		for _, op := range h.Ops() {
			if op.Kind == "effect" && op.OK && op.Process != holder.Process && op.Epoch > holder.Epoch {
				return nil
			}
		}
		return fmt.Errorf("no effect of another instance than %s in an epoch above %d yet", holder.Process, holder.Epoch)
	})
	if err := c.Nodes[at].Start(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	testbed.RetryUntil(t, 2*time.Minute, c.Settled)
	ready := time.Now()
	w.StopLoads()

	dropped := dropAckedEvent(t, ctx, c, h)
	final, err := w.Final(ctx, 30*time.Second)
	w.Stop()
	if err != nil {
		t.Fatalf("read the mesh: %v", err)
	}
	final.HealedAt, final.ReadyAt, final.ReadyBound = healed, ready, 2*time.Minute
	rep := Check(h.Ops(), final, WorkloadBounds())
	t.Log(rep.String())
	found := func(check, kind, key string) bool {
		return slices.ContainsFunc(rep.Anomalies(), func(a Anomaly) bool {
			return a.Check == check && a.Kind == kind && (key == "" || slices.Contains(a.Keys, key))
		})
	}
	if !found(checkFencing, "unfenced", ledgerSeat) {
		t.Errorf("the fencing check did not report %s's effects in epoch %d after another instance's in a greater epoch", holder.Process, holder.Epoch)
	}
	if !found(checkLost, "lost-from-stream", dropped) {
		t.Errorf("the lost check did not report acked event %s, deleted from EVENTS", dropped)
	}
}

// lastAcquire is the newest acquisition of the ledger seat in ops; its Value is the node
// the holder is on.
func lastAcquire(ops []Op) (Op, bool) {
	for _, op := range slices.Backward(ops) {
		if op.Kind == "acquire" && op.OK && op.Key == ledgerSeat {
			return op, true
		}
	}
	return Op{}, false
}

// dropAckedEvent deletes from EVENTS the newest event of one of chaos-pub's instances whose
// emit was acked, and returns its id.
func dropAckedEvent(t *testing.T, ctx context.Context, c *Cluster, h *History) string {
	t.Helper()
	acked := map[string]bool{}
	for _, op := range h.Ops() {
		if op.Kind == "emit" && op.OK {
			acked[op.Key] = true
		}
	}
	nc, err := c.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	// The newest event on the subject is an acked one unless its emit was still in flight
	// when the loads stopped; the stream is read back from there.
	subject := manifest.EventSubject(pubModule, tickEvent)
	last, err := stream.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatalf("the newest %s event: %v", subject, err)
	}
	for seq := last.Sequence; seq > 0 && last.Sequence-seq < 1000; seq-- {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil || m.Subject != subject {
			continue
		}
		id := m.Header.Get(envelope.EventID)
		if !acked[id] {
			continue
		}
		if err := stream.DeleteMsg(ctx, seq); err != nil {
			t.Fatalf("delete event %s (sequence %d) from EVENTS: %v", id, seq, err)
		}
		t.Logf("deleted acked event %s (sequence %d) from EVENTS", id, seq)
		return id
	}
	t.Fatalf("no acked %s event among the last 1000 messages of EVENTS", subject)
	return ""
}
