package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

func (b *bed) audit(req api.AuditRequest) api.AuditReply {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reply, err := audit.Call(ctx, b.op, b.n.Identity().Name, req)
	if err != nil {
		b.t.Fatalf("audit %s: %v", req.Op, err)
	}
	return reply
}

// auditAll returns every record of a source, paging through the audit tool.
func (b *bed) auditAll(source string) []api.AuditRecord {
	var out []api.AuditRecord
	f := api.AuditFilter{Source: source, Limit: api.AuditDefaultLimit}
	for {
		recs := b.audit(api.AuditRequest{Op: "query", Filter: f}).Records
		out = append(out, recs...)
		if len(recs) < f.Limit {
			return out
		}
		f.After = recs[len(recs)-1].N
	}
}

// auditTruthful checks the whole audit log once it has caught up: every record is a genuine
// event, and a query for the name `audit tail` prints it by (envelope.Key) finds it.
func (b *bed) auditTruthful(t *testing.T) {
	t.Helper()
	b.waitAudited(20 * time.Second)
	all := b.auditAll("")
	byName := map[string]int{}
	for _, r := range all {
		if r.NotGenuine != "" {
			t.Errorf("the mesh's own %s (source %s) is not genuine: %s: %s", envelope.Key(r.Subject), r.Source, r.NotGenuine, r.NotGenuineWhy)
		}
		byName[envelope.Key(r.Subject)]++
	}
	if len(byName) < 5 {
		t.Fatalf("the audit log holds %d kinds of event (%v): too few to check the names by", len(byName), byName)
	}
	for name, n := range byName {
		found := 0
		f := api.AuditFilter{Event: name, Limit: api.AuditDefaultLimit}
		reply := b.audit(api.AuditRequest{Op: "query", Filter: f})
		if reply.Error != "" {
			t.Errorf("query --event %s: %s", name, reply.Error)
			continue
		}
		for _, r := range reply.Records {
			if envelope.Key(r.Subject) == name {
				found++
			}
		}
		if found != n {
			t.Errorf("query --event %s finds %d of its %d records", name, found, n)
		}
	}
	if v := b.audit(api.AuditRequest{Op: "verify"}).Verification; v == nil || v.FlaggedTotal != 0 || v.Broken != nil {
		t.Errorf("verify: %+v", v)
	}
}

// waitAudited waits until the audit log has caught up with EVENTS.
func (b *bed) waitAudited(timeout time.Duration) {
	b.t.Helper()
	retryUntil(b.t, timeout, func() error {
		if st := b.n.Status(context.Background()); st.Audit.Lag != 0 {
			return fmt.Errorf("audit lag %d", st.Audit.Lag)
		}
		return nil
	})
}

// publishRaw publishes n events of module on event through a plain JetStream client holding
// the module's key, asynchronously; every dupEvery-th event is published a second time,
// alternately with the same Nats-Msg-Id (the broker drops it) and with a new one (the stream
// keeps it; the audit log must record it once).
func publishRaw(t *testing.T, b *bed, seedFile, module, event string, n, dupEvery int) (ids []string) {
	t.Helper()
	kp := mustKey(t, seedFile)
	sk, _ := envelope.NewSigningKey(kp)
	nc := b.raw(seedFile, module)
	// A bounded window: at most 256 unacknowledged, and a publish at the window waits for an
	// ack as long as the test would (the client's default 200 ms failed the 100,000-event
	// audit on a busy machine: "stalled with too many outstanding async published messages").
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	stall := jetstream.WithStallWait(30 * time.Second)
	subject := manifest.EventSubject(module, event)
	body := []byte(`{"n":0}`)
	for i := range n {
		h, err := envelope.Stamp(sk, module, "alpha", subject, body, envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: manifest.AdmitSubject(module, subject), Header: h, Data: body}
		if _, err := js.PublishMsgAsync(msg, stall); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.Get(envelope.EventID))
		if dupEvery > 0 && i%dupEvery == 0 {
			dup := &nats.Msg{Subject: manifest.AdmitSubject(module, subject), Header: nats.Header{}, Data: body}
			for k, v := range h {
				dup.Header[k] = v
			}
			if (i/dupEvery)%2 == 1 {
				dup.Header.Set(nats.MsgIdHdr, "again-"+h.Get(envelope.EventID))
			}
			if _, err := js.PublishMsgAsync(dup, stall); err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		t.Fatal("async publishes not acknowledged in 60s")
	}
	return ids
}

// TestAudit_TamperAndForgery: an event with a forged signature is recorded and flagged; a
// byte changed in a stored record makes verify name that record.
func TestAudit_TamperAndForgery(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir, "alpha")
	b := newBedAt(t, cfg)
	seed, _ := b.register("module: m\nrequires: [mesh-bus]\nemits: [tick]\n")
	publishRaw(t, b, seed, "m", "tick", 10, 0)
	b.waitAudited(20 * time.Second)
	if v := b.audit(api.AuditRequest{Op: "verify"}).Verification; !v.OK() {
		t.Fatalf("verify before tampering: %+v %+v", v.Broken, v.Flagged)
	}
	recs := b.auditAll("m")
	target := recs[4].N

	// A forged event: m's own key publishes, but signs with another.
	other, _ := nkeys.CreateUser()
	sk, _ := envelope.NewSigningKey(other)
	subject := manifest.EventSubject("m", "tick")
	h, _ := envelope.Stamp(sk, "m", "alpha", subject, []byte("{}"), envelope.Options{})
	js, _ := jetstream.New(b.raw(seed, "m"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("m", subject), Header: h, Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	b.waitAudited(20 * time.Second)
	forged := b.audit(api.AuditRequest{Op: "query", Filter: api.AuditFilter{ID: h.Get(envelope.EventID)}}).Records
	if len(forged) != 1 || forged[0].Signed || !strings.Contains(forged[0].SignatureError, "does not verify") {
		t.Fatalf("forged event: %+v", forged)
	}
	// A different event under an id already used is kept, and flagged too.
	h2, _ := envelope.Stamp(mustSigner(t, seed), "m", "alpha", subject, []byte(`{"other":1}`), envelope.Options{ID: recs[0].EventID})
	h2.Set(nats.MsgIdHdr, "another") // past the broker's dedup: an emitter reusing an id
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("m", subject), Header: h2, Data: []byte(`{"other":1}`)}); err != nil {
		t.Fatal(err)
	}
	b.waitAudited(20 * time.Second)
	reused := b.audit(api.AuditRequest{Op: "query", Filter: api.AuditFilter{Source: "m", Last: 1}}).Records
	if len(reused) != 1 || reused[0].ReusedID != recs[0].N {
		t.Fatalf("an event reusing %s: %+v", recs[0].EventID, reused)
	}
	v := b.audit(api.AuditRequest{Op: "verify"}).Verification
	// Both are listed, each with its kind; the log is intact.
	if v.Broken != nil || v.FlaggedTotal != 2 || len(v.Flagged) != 2 ||
		v.Flagged[0].N != forged[0].N || v.Flagged[0].Kind != api.AuditFlagBadSignature ||
		v.Flagged[1].N != reused[0].N || v.Flagged[1].Kind != api.AuditFlagReusedID {
		t.Fatalf("verify with a forged event and a reused id: broken %+v flagged %+v, want records %d (bad signature) and %d (reused id)",
			v.Broken, v.Flagged, forged[0].N, reused[0].N)
	}
	b.close()

	// Change one byte of one stored record.
	db, err := bolt.Open(filepath.Join(dir, "meshnode.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte("audit"))
		key := make([]byte, 8)
		for i := range 8 {
			key[7-i] = byte(target >> (8 * i))
		}
		raw := append([]byte(nil), bk.Get(key)...)
		i := strings.Index(string(raw), "tick") // the event's subject, first in the record
		if i < 0 {
			return fmt.Errorf("record %d does not hold its subject: %q", target, raw)
		}
		raw[i] = 'u' // still a record that reads, now of another subject
		return bk.Put(key, raw)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	b = newBedAt(t, cfg)
	v = b.audit(api.AuditRequest{Op: "verify"}).Verification
	if v.Broken == nil || v.Broken.N != target {
		t.Fatalf("verify after tampering with record %d: %+v", target, v.Broken)
	}
}

func mustSigner(t *testing.T, seedFile string) *envelope.SigningKey {
	t.Helper()
	sk, err := envelope.NewSigningKey(mustKey(t, seedFile))
	if err != nil {
		t.Fatal(err)
	}
	return sk
}

// TestAudit_AnEarlierNodesConsumerAcksAll: a node of an earlier version made its audit
// consumer ack each event on its own, and JetStream cannot change an ack policy in place.
// The node makes the consumer again to ack all, from where the old one's acks had reached:
// the log neither reads EVENTS again from its start nor loses what it had not read (ten
// events published after the old floor, while the log waited).
func TestAudit_AnEarlierNodesConsumerAcksAll(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	b := newBedAt(t, cfg)
	seed, _ := b.register("module: m\nrequires: [mesh-bus]\nemits: [tick]\n")
	publishRaw(t, b, seed, "m", "tick", 40, 0)
	b.waitAudited(20 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := manifest.AuditConsumer("alpha").Name
	// The consumer as an earlier node made it (the drift check may make it again between
	// the delete and the create, so both are retried).
	var old jetstream.Consumer
	retryUntil(t, 20*time.Second, func() error {
		if err := b.js.DeleteConsumer(ctx, manifest.EventsStreamName, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return err
		}
		var err error
		old, err = b.js.CreateConsumer(ctx, manifest.EventsStreamName, jetstream.ConsumerConfig{
			Durable: name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: manifest.AuditAckWait,
			MaxAckPending: manifest.AuditMaxAckPending, MaxDeliver: -1,
		})
		return err
	})
	// It had acked the first half of EVENTS.
	total := old.CachedInfo().NumPending
	batch, err := old.Fetch(int(total / 2))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	info, err := old.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	floor := info.AckFloor.Stream
	if floor < total/2 {
		t.Fatalf("the earlier consumer acked to %d of %d", floor, total)
	}
	// Events past the floor the log has not read: the log does not read a consumer that
	// does not ack all.
	publishRaw(t, b, seed, "m", "tick", 10, 0)
	b.close()

	b = newBedAt(t, cfg)
	b.waitAudited(20 * time.Second)
	c, err := b.js.Consumer(ctx, manifest.EventsStreamName, name)
	if err != nil {
		t.Fatal(err)
	}
	info = c.CachedInfo()
	if info.Config.AckPolicy != jetstream.AckAllPolicy {
		t.Fatalf("the audit consumer acks %s", info.Config.AckPolicy)
	}
	// The log's run starts at the ack floor: it was delivered what came after the old
	// consumer's floor, not EVENTS from its start.
	if read := info.Delivered.Consumer; read > info.Delivered.Stream-floor {
		t.Fatalf("the log read %d events of EVENTS' %d after the old floor %d: it started again", read, info.Delivered.Stream, floor)
	}
	if n := len(b.auditAll("m")); n != 50 {
		t.Fatalf("the log holds %d of m's 50 events", n)
	}
}

// TestAudit_ForgedControllerEvent: the controller's events are genuine only signed by the
// node holding mesh-controller, under the seat's name: one signed by another key, and one a
// module signed in its own name, are flagged — and counted in
// meshnode_audit_not_genuine_total — while the controller's own events pass.
func TestAudit_ForgedControllerEvent(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: m\nrequires: [mesh-bus]\n") // the node's own events: module.registered
	other, _ := nkeys.CreateUser()
	subject := manifest.SeatEventSubject(manifest.ControllerSeat, "provisioned")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ids []string
	for i, source := range []string{manifest.ControllerSeat, "m"} {
		var signer envelope.Signer = other
		if i == 1 {
			signer = mustSigner(t, seed)
		}
		h, _ := envelope.Stamp(signer, source, "alpha", subject, []byte("{}"), envelope.Options{})
		if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.Get(envelope.EventID))
	}
	b.waitAudited(20 * time.Second)
	want := []string{api.AuditFlagBadSignature, api.AuditFlagSourceMismatch}
	for i, id := range ids {
		recs := b.audit(api.AuditRequest{Op: "query", Filter: api.AuditFilter{ID: id}}).Records
		if len(recs) != 1 || recs[0].NotGenuine != want[i] {
			t.Fatalf("a controller event forged as %s: %+v, want it judged %s", []string{"the seat", "module m"}[i], recs, want[i])
		}
	}
	metrics := scrape(t, b.n.HTTPURL())
	for _, kind := range want {
		if n := counter(metrics, "meshnode_audit_not_genuine_total", "kind", kind); n != 1 {
			t.Errorf("meshnode_audit_not_genuine_total{kind=%q} = %v, want 1", kind, n)
		}
	}
	if n := counter(metrics, "meshnode_audit_not_genuine_total", "kind", api.AuditFlagUnsigned); n != 0 {
		t.Errorf("meshnode_audit_not_genuine_total{kind=unsigned} = %v, want 0", n)
	}
	if v := b.audit(api.AuditRequest{Op: "verify"}).Verification; v.FlaggedTotal != 2 {
		t.Errorf("verify flags %d: %+v, want the 2 forgeries", v.FlaggedTotal, v.Flagged)
	}
}
