package node_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestEmit_RetryIsOneEvent: Emit fixes the event's id before its first attempt and returns
// it with an error; a retry with sdk.Retry(id) is the same event — same id, time and
// signature — so the stream stores it once and the audit log records it once, however many
// attempts were stored.
func TestEmit_RetryIsOneEvent(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	c := b.client(seed)

	// An attempt that fails still names its event.
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	cancel()
	id, err := c.Emit(expired, "order.placed", map[string]int{"order": 7})
	if err == nil || id == "" {
		t.Fatalf("Emit with an expired context: id %q, err %v; want the id and an error", id, err)
	}
	if _, err := envelope.ParseID(id); err != nil {
		t.Fatalf("the id of a failed attempt: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 3 {
		got, err := c.Emit(ctx, "order.placed", map[string]int{"order": 7}, sdk.Retry(id))
		if err != nil || got != id {
			t.Fatalf("retry %d: id %q, err %v; want %s", i+1, got, err, id)
		}
	}
	subject := manifest.EventSubject("a", "order.placed")
	if n := eventsOn(t, b, subject); n != 1 {
		t.Errorf("EVENTS holds %d messages of the retried event, want 1", n)
	}
	// Outside the broker's window (a copy published under another Nats-Msg-Id, as a retry
	// after two minutes would be stored), the copy is the same event to the audit log.
	events, err := b.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	nc := b.raw(seed, "a")
	js, _ := jetstream.New(nc)
	m.Header.Set("Nats-Msg-Id", "late-retry")
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("a", subject), Header: m.Header, Data: m.Data}); err != nil {
		t.Fatal(err)
	}
	b.waitAudited(20 * time.Second)
	recs := b.auditAll("a")
	if len(recs) != 1 || recs[0].EventID != id || recs[0].ReusedID != 0 || !recs[0].Signed {
		t.Errorf("audit records of the retried event: %+v", recs)
	}

	// An id too old to send again: consumers would refuse its x-time as a replay.
	if _, err := c.Emit(ctx, "order.placed", "{}", sdk.Retry("01936b2e-1f00-7000-8000-000000000001")); err == nil || !strings.Contains(err.Error(), "older than") {
		t.Errorf("Retry of a 2024 id: %v, want a refusal", err)
	}
	if _, err := c.Emit(ctx, "order.placed", "{}", sdk.Retry("not-a-uuid")); !errors.Is(err, envelope.ErrBadEventID) {
		t.Errorf("Retry with a bad id: %v, want ErrBadEventID", err)
	}
}

// TestEmit_TraceFollowsTheEvent: an event emitted with a traceparent reaches a handler, and
// what the handler emits with its context carries a child traceparent (same trace, new span)
// and x-causation-id naming the handled event; a job it submits does too.
func TestEmit_TraceFollowsTheEvent(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.order.placed]\nemits: [order.billed]\nuses: [printer]\n")
	seedP, _ := b.register("module: p\nrequires: [mesh-bus]\nseats:\n  printer: {scope: mesh, retain: 1h, accepts: [print]}\n")
	seedC, _ := b.register("module: c\nrequires: [mesh-bus]\nconsumes: [b.order.billed]\n")
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	cb := b.client(seedB)
	if err := cb.On("a.order.placed", func(ctx context.Context, e sdk.Event) error {
		if _, err := cb.Emit(ctx, "order.billed", e.Data); err != nil {
			return err
		}
		_, err := cb.Submit(ctx, "printer", "print", e.Data)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	got := make(chan sdk.Event, 2)
	cc := b.client(seedC)
	if err := cc.On("b.order.billed", func(_ context.Context, e sdk.Event) error { got <- e; return nil }); err != nil {
		t.Fatal(err)
	}
	cp := b.client(seedP)
	if err := cp.Accept("print", func(_ context.Context, j sdk.Job) error { got <- j.Event; return nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, err := b.client(seedA).Emit(ctx, "order.placed", `{"order":7}`, sdk.WithTraceparent(tp))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case e := <-got:
			child := e.Header.Get(envelope.Traceparent)
			if e.Causation != id || !envelope.ValidTraceparent(child) || child[:36] != tp[:36] || child[36:52] == tp[36:52] {
				t.Errorf("%s: x-causation-id %q (want %s), traceparent %q (want a child of %s)", e.Key, e.Causation, id, child, tp)
			}
		case <-ctx.Done():
			t.Fatal("the follow-up event and job did not arrive")
		}
	}
}

// TestEmit_Pipelined: EmitAsync sends 3,000 events (past MaxInFlight, so its bound is met
// and freed) without waiting for each; Flush returns once JetStream has answered all; each
// Pending reports its event stored; EVENTS holds every one, once; a consumer hears each; the
// audit log has every one, signed.
func TestEmit_Pipelined(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	sinkSeed, _ := b.register("module: sink\nrequires: [mesh-bus]\nconsumes: [a.order.placed]\n")
	c := b.client(seed)
	sink := b.client(sinkSeed)
	const n = 3000
	heard := make(chan string, n)
	if err := sink.On("a.order.placed", func(_ context.Context, e sdk.Event) error {
		heard <- e.ID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sent := make([]*sdk.Pending, 0, n)
	for i := range n {
		p, err := c.EmitAsync(ctx, "order.placed", map[string]int{"order": i})
		if err != nil {
			t.Fatalf("EmitAsync %d: %v", i, err)
		}
		sent = append(sent, p)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	ids := map[string]bool{}
	for _, p := range sent {
		select {
		case <-p.Done():
		default:
			t.Fatalf("event %s not answered after Flush", p.ID())
		}
		if p.Err() != nil {
			t.Fatalf("event %s: %v", p.ID(), p.Err())
		}
		ids[p.ID()] = true
	}
	if len(ids) != n {
		t.Fatalf("%d distinct ids for %d events", len(ids), n)
	}
	if got := eventsOn(t, b, manifest.EventSubject("a", "order.placed")); got != n {
		t.Fatalf("EVENTS holds %d events, want %d", got, n)
	}
	for range n {
		select {
		case id := <-heard:
			if !ids[id] {
				t.Fatalf("the consumer heard %s, which was not sent", id)
			}
		case <-ctx.Done():
			t.Fatal("the consumer did not hear every event")
		}
	}
	b.waitAudited(30 * time.Second)
	recs := b.auditAll("a")
	if len(recs) != n {
		t.Fatalf("the audit log has %d of a's events, want %d", len(recs), n)
	}
	for _, r := range recs {
		if !r.Signed || !ids[r.EventID] {
			t.Fatalf("audit record %d: signed %v, id %s", r.N, r.Signed, r.EventID)
		}
	}
}
