package admit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// bed is a real nats-server with JetStream, an EVENTS-like stream and a work queue, and an
// admitter whose audit log is a map the test fills.
type bed struct {
	a      *Admitter
	js     jetstream.JetStream // a module's: publishes under its prefix
	mu     sync.Mutex
	heldBy map[string]int64
}

func newBed(t *testing.T, cfg Config) *bed {
	t.Helper()
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: manifest.EventPatterns(), Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SEAT_q", Subjects: []string{"mesh.seat.q.accept.>"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	b := &bed{js: js, heldBy: map[string]int64{}}
	cfg.Dial = srv.InProcessConn
	cfg.Held = func(owner string) int64 {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.heldBy[owner]
	}
	cfg.Owners = func(module string) []string { return []string{"mod." + module} }
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b.a = a
	return b
}

// event is a's event on subject with a body of n bytes and its own id.
func event(module, name string, n int) *nats.Msg {
	subject := manifest.EventSubject(module, name)
	h := nats.Header{}
	id := time.Now().Format("150405.000000000")
	h.Set(envelope.EventID, id)
	h.Set(nats.MsgIdHdr, id)
	return &nats.Msg{Subject: manifest.AdmitSubject(module, subject), Header: h, Data: []byte(strings.Repeat("x", n))}
}

// refusal publishes m and returns the admitter's refusal code (0: stored).
func (b *bed) publish(t *testing.T, m *nats.Msg) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := b.js.PublishMsg(ctx, m)
	if err == nil {
		return 0, ""
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("publish %s: %v, want a PubAck or the admitter's refusal", m.Subject, err)
	}
	return int(apiErr.ErrorCode), apiErr.Description
}

func (b *bed) use(module string) api.QuotaUse { return b.a.Use([]string{module})[0] }

// TestAdmit_QuotaCountsPendingAndHeld: what the module holds is the audit log's count plus
// what was admitted since; an event that would pass the quota is refused, final, saying
// the module, its use and its quota; what the audit log records moves from pending to held.
func TestAdmit_QuotaCountsPendingAndHeld(t *testing.T) {
	b := newBed(t, Config{Limit: 10_000, EventsMaxAge: time.Hour})
	first := event("a", "x", 3000)
	size := envelope.StoredSize(manifest.EventSubject("a", "x"), first.Header, first.Data)
	if code, d := b.publish(t, first); code != 0 {
		t.Fatalf("first event: refused %d %s", code, d)
	}
	if u := b.use("a"); u.Pending != size || u.Held != 0 {
		t.Fatalf("after one event: %+v, want %d pending", u, size)
	}
	for range 2 {
		if code, d := b.publish(t, event("a", "x", 3000)); code != 0 {
			t.Fatalf("refused %d %s under the quota", code, d)
		}
	}
	code, d := b.publish(t, event("a", "x", 3000))
	if code != api.AdmitOverQuota || !strings.Contains(d, "module a holds") || !strings.Contains(d, "module-events-max-bytes") {
		t.Fatalf("the fourth 3 KB event under a 10 KB quota: %d %q, want the quota's refusal naming the module and the setting", code, d)
	}
	if api.AdmitRetryable(code) {
		t.Fatal("the quota's refusal is retryable")
	}
	// Another module is not held to a's use.
	if code, d := b.publish(t, event("b", "x", 3000)); code != 0 {
		t.Fatalf("module b refused: %d %s", code, d)
	}
	// The audit log records the first: it is held now, no longer pending.
	b.mu.Lock()
	b.heldBy["mod.a"] = size
	b.mu.Unlock()
	b.a.Recorded([]string{first.Header.Get(envelope.EventID)}, time.Now(), func() {})
	if u := b.use("a"); u.Held != size || u.Pending != 2*size || u.Refused[ReasonQuota] != 1 {
		t.Fatalf("after the audit log recorded one: %+v", u)
	}
}

// TestAdmit_SweepForgetsWhatIsNeverRecorded: a duplicate the stream drops (same Nats-Msg-Id)
// is admitted but never recorded; the sweep forgets it once the audit log has recorded
// something stored after it, or has caught up.
func TestAdmit_SweepForgetsWhatIsNeverRecorded(t *testing.T) {
	b := newBed(t, Config{Limit: 1 << 20})
	b.a.margin = 0
	m := event("a", "x", 100)
	for range 2 {
		if code, d := b.publish(t, m); code != 0 {
			t.Fatalf("refused %d %s", code, d)
		}
	}
	again := event("a", "x", 100)
	again.Header.Set(envelope.EventID, "again-"+m.Header.Get(envelope.EventID))
	again.Header.Set(nats.MsgIdHdr, m.Header.Get(nats.MsgIdHdr)) // a duplicate to the stream
	if code, d := b.publish(t, again); code != 0 {
		t.Fatalf("refused %d %s", code, d)
	}
	if u := b.use("a"); u.Pending == 0 {
		t.Fatal("nothing pending after two admitted ids")
	}
	b.a.Recorded([]string{m.Header.Get(envelope.EventID)}, time.Now(), func() {})
	b.a.Sweep(false)
	if u := b.use("a"); u.Pending != 0 {
		t.Fatalf("the duplicate is still pending after the audit log recorded a later event: %+v", u)
	}
	if code, _ := b.publish(t, event("a", "y", 10)); code != 0 {
		t.Fatal("refused")
	}
	b.a.Sweep(true)
	if u := b.use("a"); u.Pending != 0 {
		t.Fatalf("pending after a sweep while caught up: %+v", u)
	}
}

// TestAdmit_BackPressureAndPace: while the lag is past MaxLag an event is refused retryably
// (a job is not: the audit log does not read work queues); past its pace a module is
// refused retryably, another module is not, and a module refused on and on is reported as
// flooding.
func TestAdmit_BackPressureAndPace(t *testing.T) {
	var flooded atomic.Value
	b := newBed(t, Config{MaxLag: 100, Rate: 1, Burst: 1, Flooding: func(module string, n uint64) { flooded.Store(module) }})
	b.a.SetLag(101)
	code, d := b.publish(t, event("a", "x", 10))
	if code != api.AdmitAuditBehind || !api.AdmitRetryable(code) || !strings.Contains(d, "behind by 101") {
		t.Fatalf("an event while the audit log is behind: %d %q", code, d)
	}
	job := &nats.Msg{Subject: manifest.AdmitSubject("b", "mesh.seat.q.accept.run"), Data: []byte("{}")}
	if code, d := b.publish(t, job); code != 0 {
		t.Fatalf("a job while the audit log is behind: refused %d %s", code, d)
	}
	b.a.SetLag(100)
	code, d = b.publish(t, event("b", "x", 10)) // b spent its one a second on the job
	if code != api.AdmitOverRate || !api.AdmitRetryable(code) || !strings.Contains(d, "module b sends faster") {
		t.Fatalf("b past its pace: %d %q", code, d)
	}
	if code, d := b.publish(t, event("c", "x", 10)); code != 0 {
		t.Fatalf("module c, within its pace, refused: %d %s", code, d)
	}
	nc := b.js.Conn()
	for range floodRefusals(1) + 1 { // the first is within its pace
		nc.Publish(manifest.AdmitSubject("d", manifest.EventSubject("d", "x")), nil)
	}
	nc.Flush()
	deadline := time.Now().Add(10 * time.Second)
	for flooded.Load() != "d" {
		if time.Now().After(deadline) {
			t.Fatalf("module d refused %d times in a second is not reported as flooding (%+v)", floodRefusals(1), b.use("d"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAdmit_RefusesWhatIsNotAnEventOrJob: a tool call, an event without its envelope, and a
// subject outside the grammar are refused, final.
func TestAdmit_RefusesWhatIsNotAnEventOrJob(t *testing.T) {
	b := newBed(t, Config{})
	for _, m := range []*nats.Msg{
		{Subject: manifest.AdmitSubject("a", manifest.ToolSubject("a", "t")), Data: []byte("{}")},
		{Subject: manifest.AdmitSubject("a", manifest.EventSubject("a", "x")), Data: []byte("{}")},
		{Subject: "mesh.admit.a", Data: []byte("{}")},
	} {
		if code, d := b.publish(t, m); code != api.AdmitNotAdmitted || d == "" {
			t.Errorf("%s: %d %q, want refused as not admitted", m.Subject, code, d)
		}
	}
}

// TestAdmit_ConnectsAgain: when the server ends the admitter's connection (a slow reader's,
// say), the admitter connects again and admits as before.
func TestAdmit_ConnectsAgain(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "EVENTS", Subjects: manifest.EventPatterns()}); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Dial: srv.InProcessConn, Held: func(string) int64 { return 0 }, Owners: func(string) []string { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := &bed{a: a, js: js}
	if code, d := b.publish(t, event("a", "x", 10)); code != 0 {
		t.Fatalf("refused %d %s", code, d)
	}
	cz, err := srv.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ended := 0
	for _, c := range cz.Conns {
		if c.Name == "admitter" {
			if err := srv.DisconnectClientByID(c.Cid); err != nil {
				t.Fatal(err)
			}
			ended++
		}
	}
	if ended != 1 {
		t.Fatalf("found %d admitter connections, want 1", ended)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.PublishMsg(ctx, event("a", "x", 10))
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no admission 10 s after the server ended the admitter's connection: %v", err)
		}
	}
}
