package node_test

import (
	"context"
	"errors"
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
	events, err := b.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := events.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[subject]; n != 1 {
		t.Errorf("EVENTS holds %d messages of the retried event, want 1", n)
	}
	// Outside the broker's window (a copy published under another Nats-Msg-Id, as a retry
	// after two minutes would be stored), the copy is the same event to the audit log.
	m, err := events.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	nc := b.raw(seed, "a")
	js, _ := jetstream.New(nc)
	m.Header.Set("Nats-Msg-Id", "late-retry")
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: m.Header, Data: m.Data}); err != nil {
		t.Fatal(err)
	}
	b.waitAudited(20 * time.Second)
	recs := b.auditAll("a")
	if len(recs) != 1 || recs[0].EventID != id || recs[0].ReusedID != 0 || !recs[0].Signed {
		t.Errorf("audit records of the retried event: %+v", recs)
	}

	if _, err := c.Emit(ctx, "order.placed", "{}", sdk.Retry("not-a-uuid")); !errors.Is(err, envelope.ErrBadEventID) {
		t.Errorf("Retry with a bad id: %v, want ErrBadEventID", err)
	}
}
