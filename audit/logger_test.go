package audit

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// delivered is a message as the audit consumer receives it; only what write reads is real.
type delivered struct {
	jetstream.Msg
	subject string
	header  nats.Header
	data    []byte
	seq     uint64
	at      time.Time // the stream's time; zero: now
}

func (m delivered) Subject() string      { return m.subject }
func (m delivered) Headers() nats.Header { return m.header }
func (m delivered) Data() []byte         { return m.data }
func (m delivered) Metadata() (*jetstream.MsgMetadata, error) {
	at := m.at
	if at.IsZero() {
		at = time.Now()
	}
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.seq}, Timestamp: at}, nil
}

// TestLogger_InvalidUTF8 is an emitter's header bomb: header values (and names) that are not
// UTF-8. JSON stores such a byte as U+FFFD, so a record hashed over the bytes as received
// would read back as a different record, and verify would call a genuine event altered.
func TestLogger_InvalidUTF8(t *testing.T) {
	l, _, kp := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
	subject := "mesh.mod.m.event.tick"
	var msgs []jetstream.Msg
	for i, bad := range []string{"\xff\xfe", "a\xc3\x28b", "\xed\xa0\x80", "ok \x00 nul"} {
		h, err := envelope.Stamp(kp, "m", "n", subject, []byte("{}"), envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		h.Set("x-bad", bad)
		h[envelope.Causation] = []string{bad, "valid"}
		msgs = append(msgs, delivered{subject: subject, header: h, data: []byte("{}"), seq: uint64(i + 1)})
	}
	if _, err := l.write(msgs); err != nil {
		t.Fatal(err)
	}
	v, err := l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if !v.OK() {
		t.Fatalf("verify of genuine events: broken %+v, flagged %+v", v.Broken, v.Flagged)
	}
	if got, want := v.Records, uint64(len(msgs)); got != want {
		t.Fatalf("verify read %d records, want %d", got, want)
	}
	recs, err := l.Query(api.AuditFilter{Source: "m"})
	if err != nil || len(recs) != len(msgs) {
		t.Fatalf("query: %d records, %v", len(recs), err)
	}
	if got := recs[0].Headers["x-bad"]; len(got) != 1 || got[0] != "\uFFFD" {
		t.Errorf("an invalid header value is recorded as %q, want U+FFFD in its place", got)
	}
}

// testLogger opens the log of node n in the bbolt file at path (closed when the test ends),
// whose one known source is module m, with key kp (a new one when nil).
func testLogger(tb testing.TB, path string, kp nkeys.KeyPair) (*Logger, *bolt.DB, nkeys.KeyPair) {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	if kp == nil {
		kp, _ = nkeys.CreateUser()
	}
	pub, _ := kp.PublicKey()
	keys := func(_, source string, _ uint64, _ time.Time) (string, bool) { return pub, source == "m" }
	owners := func(subject, source string) bool { return source == "m" }
	l, err := New(db, nil, "n", keys, owners, 0, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return l, db, kp
}

// TestLogger_HugeHeaders: an emitter's x-event-id and x-source of 40 KiB, past bbolt's key
// limit, used to fail their batch on every redelivery and stop the log; now the event is
// written, found by id and by source, and recorded once when it comes again.
func TestLogger_HugeHeaders(t *testing.T) {
	l, _, kp := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
	subject := "mesh.mod.m.event.tick"
	h, err := envelope.Stamp(kp, "m", "n", subject, []byte("{}"), envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	id, source := strings.Repeat("i", 40<<10), strings.Repeat("s", 40<<10)
	h.Set(envelope.EventID, id)
	h.Set(envelope.Source, source)
	m := delivered{subject: subject, header: h, data: []byte("{}"), seq: 1}
	for range 2 {
		if _, err := l.write([]jetstream.Msg{m, delivered{subject: subject, header: h, data: []byte("{}"), seq: 2}}); err != nil {
			t.Fatalf("a batch with a 40 KiB id and source: %v", err)
		}
	}
	if l.Records() != 1 {
		t.Fatalf("%d records, want 1 (the same event, delivered four times)", l.Records())
	}
	for _, f := range []api.AuditFilter{{ID: id}, {Source: source}} {
		if recs, err := l.Query(f); err != nil || len(recs) != 1 || recs[0].EventID != id {
			t.Fatalf("query by %.20s…: %d records, %v", f.ID+f.Source, len(recs), err)
		}
	}
}

// TestLogger_Prune: records past the retention go with their index entries, and the chain
// verifies from the first kept record, against the anchor the prune left; the index by time
// holds one entry a batch, and an older log's entries (one a record) are pruned alike.
func TestLogger_Prune(t *testing.T) {
	l, _, kp := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
	l.retention = time.Hour
	subject := "mesh.mod.m.event.tick"
	var ids []string
	batch := func(at time.Time, seqs ...uint64) {
		l.clock = func() time.Time { return at }
		var msgs []jetstream.Msg
		for _, seq := range seqs {
			h, err := envelope.Stamp(kp, "m", "n", subject, []byte("{}"), envelope.Options{})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, h.Get(envelope.EventID))
			msgs = append(msgs, delivered{subject: subject, header: h, data: []byte("{}"), seq: seq})
		}
		if _, err := l.write(msgs); err != nil {
			t.Fatal(err)
		}
	}
	// An older log's index by time held an entry a record: records 1 and 2 are indexed so.
	batch(time.Now().Add(-3*time.Hour), 1, 2)
	db := l.db
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketByTime)
		k, v := b.Cursor().First()
		if len(k) != 16 || binary.BigEndian.Uint64(k[8:]) != 1 || binary.BigEndian.Uint64(v) != 2 {
			return fmt.Errorf("the batch's entry by time: %x → %x, want its first record, 1, → its last, 2", k, v)
		}
		if err := b.Delete(k); err != nil {
			return err
		}
		for n := uint64(1); n <= 2; n++ {
			if err := b.Put(append(slices.Clone(k[:8]), u64(n)...), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	batch(time.Now().Add(-2*time.Hour), 3, 4)
	batch(time.Now(), 5)
	db.View(func(tx *bolt.Tx) error {
		if n := tx.Bucket(bucketByTime).Stats().KeyN; n != 4 {
			t.Errorf("%d entries by time, want 4: the older log's 2, and one a batch", n)
		}
		return nil
	})
	l.prune()
	if l.Records() != 1 {
		t.Fatalf("%d records after the prune, want 1", l.Records())
	}
	if v, err := l.Verify(); err != nil || !v.OK() || v.Records != 1 {
		t.Fatalf("verify after the prune: %+v, %v", v, err)
	}
	db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketIDs, bucketBySource, bucketBySubject, bucketByTime} {
			if n := tx.Bucket(b).Stats().KeyN; n != 1 {
				t.Errorf("%d entries in %s after the prune, want the kept record's 1", n, b)
			}
		}
		return nil
	})
	for i, want := range []int{0, 0, 0, 0, 1} {
		if recs, err := l.Query(api.AuditFilter{ID: ids[i]}); err != nil || len(recs) != want {
			t.Fatalf("event %d by id: %d records, %v; want %d", i+1, len(recs), err, want)
		}
	}
	if recs, err := l.Query(api.AuditFilter{Source: "m"}); err != nil || len(recs) != 1 || recs[0].EventID != ids[4] {
		t.Fatalf("by source after the prune: %+v, %v", recs, err)
	}
}

// TestLogger_PruneKeepsTheChainWhole: the newest record an entry by time older than the
// retention names takes every record before it, one received under a clock that stepped back
// too, so the chain verifies from the first kept; an entry this log does not write (its last
// record past the head) prunes its first record alone, never the records after it.
func TestLogger_PruneKeepsTheChainWhole(t *testing.T) {
	l, db, kp := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
	l.retention = time.Hour
	subject := "mesh.mod.m.event.tick"
	seq := uint64(0)
	batch := func(at time.Time, n int) {
		l.clock = func() time.Time { return at }
		var msgs []jetstream.Msg
		for range n {
			seq++
			h, err := envelope.Stamp(kp, "m", "n", subject, []byte("{}"), envelope.Options{})
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, delivered{subject: subject, header: h, data: []byte("{}"), seq: seq})
		}
		if _, err := l.write(msgs); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	batch(now.Add(-30*time.Minute), 1) // 1: within the retention, but received before 2
	batch(now.Add(-2*time.Hour), 2)    // 2, 3: the clock stepped back
	batch(now.Add(-3*time.Hour), 1)    // 4
	batch(now.Add(-90*time.Minute), 2) // 5, 6
	batch(now, 1)                      // 7
	l.prune()
	if v, err := l.Verify(); err != nil || !v.OK() || v.Records != 1 || l.Records() != 1 {
		t.Fatalf("after the prune: verify %+v, %v, %d records; want record 7 alone, intact", v, err, l.Records())
	}

	// An entry naming records past the head: its first goes, not the rest.
	batch(now, 3) // 8, 9, 10
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketByTime).Put(append(u64(uint64(now.Add(-2*time.Hour).UnixNano())), u64(8)...), u64(1<<40))
	}); err != nil {
		t.Fatal(err)
	}
	l.prune()
	if v, err := l.Verify(); err != nil || !v.OK() || v.Records != 2 || l.Records() != 2 {
		t.Fatalf("after an odd entry's prune: verify %+v, %v, %d records; want records 9 and 10, intact", v, err, l.Records())
	}
}

// TestLogger_OneVerdict: a genuine event, an unsigned one, one signed by another key and one
// whose source does not own its subject are judged alike by verify, by query's answer
// (NotGenuine, what `audit query`'s CHECK column and the dashboard print) and by the
// counts of the metric, each kind once.
func TestLogger_OneVerdict(t *testing.T) {
	_, db, kp := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
	pub, _ := kp.PublicKey()
	// m owns its own events only.
	l, err := New(db, nil, "n", func(_, source string, _ uint64, _ time.Time) (string, bool) { return pub, source == "m" },
		func(subject, source string) bool { return strings.HasPrefix(subject, "mesh.mod."+source+".") }, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := nkeys.CreateUser()
	stamp := func(signer nkeys.KeyPair, source, subject string) nats.Header {
		h, err := envelope.Stamp(signer, source, "n", subject, []byte("{}"), envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	unsigned := stamp(kp, "m", "mesh.mod.m.event.b")
	unsigned.Del(envelope.Signature)
	msgs := []jetstream.Msg{
		delivered{subject: "mesh.mod.m.event.a", header: stamp(kp, "m", "mesh.mod.m.event.a"), data: []byte("{}"), seq: 1},
		delivered{subject: "mesh.mod.m.event.b", header: unsigned, data: []byte("{}"), seq: 2},
		delivered{subject: "mesh.mod.m.event.c", header: stamp(other, "m", "mesh.mod.m.event.c"), data: []byte("{}"), seq: 3},
		delivered{subject: "mesh.mod.x.event.d", header: stamp(kp, "m", "mesh.mod.x.event.d"), data: []byte("{}"), seq: 4},
	}
	if _, err := l.write(msgs); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"mesh.mod.m.event.a": "", "mesh.mod.m.event.b": api.AuditFlagUnsigned,
		"mesh.mod.m.event.c": api.AuditFlagBadSignature, "mesh.mod.x.event.d": api.AuditFlagSourceMismatch}
	v, err := l.Verify()
	if err != nil || v.Broken != nil || v.FlaggedTotal != 3 {
		t.Fatalf("verify: %+v %v, want 3 flagged", v, err)
	}
	for _, f := range v.Flagged {
		if want[f.Subject] != f.Kind {
			t.Errorf("verify flags %s as %s, want %q", f.Subject, f.Kind, want[f.Subject])
		}
	}
	recs, err := l.Query(api.AuditFilter{})
	if err != nil || len(recs) != 4 {
		t.Fatalf("query: %d records, %v", len(recs), err)
	}
	for _, r := range recs {
		if r.NotGenuine != want[r.Subject] || (r.NotGenuine != "") != (r.NotGenuineWhy != "") {
			t.Errorf("query judges %s %q (%q), want %q as verify does", r.Subject, r.NotGenuine, r.NotGenuineWhy, want[r.Subject])
		}
	}
	counts := l.NotGenuine()
	for _, kind := range NotGenuineKinds {
		n := uint64(0)
		for _, k := range want {
			if k == kind {
				n++
			}
		}
		if counts[kind] != n {
			t.Errorf("NotGenuine()[%s] = %d, want %d", kind, counts[kind], n)
		}
	}
	// A redelivery is recorded once, and counted once.
	if _, err := l.write(msgs); err != nil {
		t.Fatal(err)
	}
	if got := l.NotGenuine()[api.AuditFlagUnsigned]; got != 1 {
		t.Errorf("after a redelivery NotGenuine()[unsigned] = %d, want 1", got)
	}
}

// TestLogger_RemembersDepartedKeys: a source the registry forgets (a server that left, a
// module removed) keeps the key its recorded events verified with: its last events, read
// after it was forgotten, and verify long after — across a restart — find them genuine.
func TestLogger_RemembersDepartedKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	_, db, kp := testLogger(t, path, nil)
	pub, _ := kp.PublicKey()
	registered := true
	keys := func(_, source string, _ uint64, _ time.Time) (string, bool) { return pub, source == "c" && registered }
	owns := func(subject, source string) bool { return strings.HasPrefix(subject, "mesh.node."+source+".") }
	l, err := New(db, nil, "n", keys, owns, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	event := func(name string, seq uint64) jetstream.Msg {
		subject := "mesh.node.c.event." + name
		h, err := envelope.Stamp(kp, "c", "c", subject, []byte("{}"), envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return delivered{subject: subject, header: h, data: []byte("{}"), seq: seq}
	}
	if _, err := l.write([]jetstream.Msg{event("joined", 1)}); err != nil {
		t.Fatal(err)
	}
	registered = false // c left: the registry forgot it
	if _, err := l.write([]jetstream.Msg{event("left", 2)}); err != nil {
		t.Fatal(err)
	}
	// Opened again (a restart), with c still forgotten.
	l, err = New(db, nil, "n", keys, owns, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := l.Verify(); err != nil || !v.OK() || v.Records != 2 {
		t.Fatalf("verify: %+v %v, want 2 records, both genuine", v, err)
	}
	// A key never seen for a source is not made up.
	stranger, _ := nkeys.CreateUser()
	h, _ := envelope.Stamp(stranger, "x", "x", "mesh.node.x.event.joined", []byte("{}"), envelope.Options{})
	if _, err := l.write([]jetstream.Msg{delivered{subject: "mesh.node.x.event.joined", header: h, data: []byte("{}"), seq: 3}}); err != nil {
		t.Fatal(err)
	}
	if recs, _ := l.Query(api.AuditFilter{Source: "x"}); len(recs) != 1 || recs[0].NotGenuine != api.AuditFlagUnknownSource {
		t.Fatalf("an unknown source's event: %+v", recs)
	}
}

// TestLogger_OneBadOfABatch: the signatures of a batch are verified together; two events of
// 200 whose bodies were changed after they were signed are recorded as bad signatures and the
// other 198 as genuine — on one core and split between three.
func TestLogger_OneBadOfABatch(t *testing.T) {
	for _, procs := range []int{2, 4} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			l, _, kp := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
			var msgs []jetstream.Msg
			// One forged in the first chunk the log verifies together (yieldEvery), one in
			// a later chunk: each chunk's verdicts land on its own events.
			forged := map[int]bool{13: true, 150: true}
			for i := range 200 {
				subject := fmt.Sprintf("mesh.mod.m.event.e%d", i)
				body := fmt.Appendf(nil, `{"n":%d}`, i)
				h, err := envelope.Stamp(kp, "m", "n", subject, body, envelope.Options{})
				if err != nil {
					t.Fatal(err)
				}
				if forged[i] {
					body = []byte(`{"n":"forged"}`)
				}
				msgs = append(msgs, delivered{subject: subject, header: h, data: body, seq: uint64(i + 1)})
			}
			if _, err := l.write(msgs); err != nil {
				t.Fatal(err)
			}
			recs, err := l.Query(api.AuditFilter{Limit: 300})
			if err != nil || len(recs) != 200 {
				t.Fatalf("query: %d records, %v", len(recs), err)
			}
			for _, r := range recs {
				bad := r.Subject == "mesh.mod.m.event.e13" || r.Subject == "mesh.mod.m.event.e150"
				if r.Signed == bad || (r.NotGenuine == api.AuditFlagBadSignature) != bad {
					t.Errorf("%s: signed %v, %q; forged %v", r.Subject, r.Signed, r.NotGenuine, bad)
				}
			}
		})
	}
}

// TestLogger_KeyLearntLater: an event recorded while its source's key was unknown is judged
// again with the key known later: genuine if that key signed it, a bad signature if not —
// never "unknown source" once the key is known.
func TestLogger_KeyLearntLater(t *testing.T) {
	_, db, kp := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
	pub, _ := kp.PublicKey()
	other, _ := nkeys.CreateUser()
	known := false
	l, err := New(db, nil, "n", func(_, source string, _ uint64, _ time.Time) (string, bool) { return pub, known && source == "m" },
		func(subject, source string) bool { return true }, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for i, signer := range []nkeys.KeyPair{kp, other} {
		subject := fmt.Sprintf("mesh.mod.m.event.e%d", i)
		h, err := envelope.Stamp(signer, "m", "n", subject, []byte("{}"), envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, delivered{subject: subject, header: h, data: []byte("{}"), seq: uint64(i + 1)})
	}
	if _, err := l.write(msgs); err != nil {
		t.Fatal(err)
	}
	if v, err := l.Verify(); err != nil || v.FlaggedTotal != 2 || v.Flagged[0].Kind != api.AuditFlagUnknownSource {
		t.Fatalf("before the key is known: %+v %v, want both unknown-source", v, err)
	}
	known = true
	v, err := l.Verify()
	if err != nil || v.FlaggedTotal != 1 || v.Flagged[0].Subject != "mesh.mod.m.event.e1" || v.Flagged[0].Kind != api.AuditFlagBadSignature {
		t.Fatalf("once the key is known: %+v %v, want e1 alone, a bad signature", v, err)
	}
}

// TestLogger_NewHolderWhileItsLeaseIsOnItsWay: a node-held seat's new holder signs its first
// event before this node's copy of the leases has its lease. Judged by the holder the node
// knows, it would be counted a bad signature, for ever; it is recorded unsettled, not counted,
// and genuine once the lease is seen. A forger naming an epoch that never comes is counted
// after deferFor, as an unknown source.
func TestLogger_NewHolderWhileItsLeaseIsOnItsWay(t *testing.T) {
	_, db, _ := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
	holders := map[uint64]nkeys.KeyPair{}
	for epoch := range uint64(2) {
		holders[epoch+1], _ = nkeys.CreateUser()
	}
	forger, _ := nkeys.CreateUser()
	seen := uint64(1) // the newest lease this node's copy has: epoch 1's
	keys := func(_, _ string, epoch uint64, _ time.Time) (string, bool) {
		kp := holders[seen] // a lease not seen: its holder now
		if epoch <= seen && holders[epoch] != nil {
			kp = holders[epoch]
		}
		pub, _ := kp.PublicKey()
		return pub, true
	}
	l, err := New(db, nil, "n", keys, func(string, string) bool { return true }, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Unsettled = func(_, _ string, epoch uint64) bool { return epoch > seen && epoch != 0 }
	subject := manifest.SeatEventSubject(manifest.ControllerSeat, "provisioned")
	var msgs []jetstream.Msg
	for i, signer := range []struct {
		kp    nkeys.KeyPair
		epoch uint64
	}{{holders[2], 2}, {forger, 3}} {
		h, err := envelope.Stamp(signer.kp, manifest.ControllerSeat, "n2", subject, []byte("{}"), envelope.Options{SeatEpoch: signer.epoch})
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, delivered{subject: subject, header: h, data: []byte("{}"), seq: uint64(i + 1)})
	}
	if _, err := l.write(msgs); err != nil {
		t.Fatal(err)
	}
	if n := l.NotGenuine(); len(n) != 0 {
		t.Fatalf("counted %v while both leases were unseen, want nothing yet", n)
	}
	seen = 2 // the new holder's lease reaches this node
	l.settleDeferred(time.Now())
	if n := l.NotGenuine(); len(n) != 0 {
		t.Fatalf("counted %v once the holder's lease was seen, want nothing (the forger's waits)", n)
	}
	v, err := l.Verify()
	if err != nil || v.FlaggedTotal != 1 || v.Flagged[0].Kind != api.AuditFlagUnknownSource || !strings.Contains(v.Flagged[0].Reason, "epoch 3") {
		t.Fatalf("verify: %+v %v, want the forger's event alone, unknown-source at epoch 3", v, err)
	}
	l.settleDeferred(time.Now().Add(deferFor + time.Second))
	if n := l.NotGenuine(); n[api.AuditFlagUnknownSource] != 1 || len(n) != 1 {
		t.Fatalf("counted %v after deferFor, want the forger's event as unknown-source", n)
	}
	if len(l.deferred) != 0 {
		t.Errorf("%d records still wait to be counted", len(l.deferred))
	}
}
