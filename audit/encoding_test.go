package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

// records are what the encoding must carry: no headers, several values, an empty body, a
// large one, a reused id, a signature error, the first record and a later one.
func sampleRecords() []api.AuditRecord {
	at := time.Date(2026, 12, 2, 6, 0, 0, 123456789, time.UTC)
	prev := strings.Repeat("ab", hashLen)
	return []api.AuditRecord{
		{N: 1, Seq: 1, Subject: "mesh.mod.m.event.tick", Received: at, EventID: "seq-1", Source: "m"},
		{N: 2, Seq: 7, Subject: "mesh.mod.m.event.tick", Headers: map[string][]string{"x-source": {"m"}, "x-causation": {"a", "b"}, "x-empty": {""}},
			Body: []byte(`{"n":1}`), Received: at, EventID: "0193-id", Source: "m", Signed: true, SourceMatches: true, Prev: prev},
		{N: 300, Seq: 1 << 40, Subject: "mesh.seat.mailer.event.sent", Body: bytes.Repeat([]byte("é"), 70000), Received: at.Add(time.Hour),
			EventID: "dup", Source: "x", SignatureError: "no registered key for source \"x\"", ReusedID: 299, Prev: prev},
	}
}

// TestEncoding_RoundTrip: a record decodes to what was encoded, with its hash; flipping any
// one byte of its stored form is caught (it does not decode, or no longer matches its hash).
func TestEncoding_RoundTrip(t *testing.T) {
	for _, want := range sampleRecords() {
		r := want
		raw := encodeRecord(&r)
		if len(r.Hash) != 2*hashLen {
			t.Fatalf("record %d: hash %q", r.N, r.Hash)
		}
		got, ok, err := decodeRecord(raw)
		if err != nil || !ok {
			t.Fatalf("record %d: decode: %v, hash ok %v", r.N, err, ok)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("record %d decoded as\n%+v\nwant\n%+v", r.N, got, r)
		}
		if len(want.Body) < 1000 {
			if j, _ := json.Marshal(want); len(raw) >= len(j) {
				t.Errorf("record %d: %d bytes stored, its JSON is %d", r.N, len(raw), len(j))
			}
		}
		for i := range min(len(raw), 2000) {
			bad := bytes.Clone(raw)
			bad[i] ^= 0x01
			if _, ok, err := decodeRecord(bad); err == nil && ok {
				t.Fatalf("record %d: byte %d flipped, and it still decodes and matches its hash", r.N, i)
			}
		}
		if _, _, err := decodeRecord(raw[:len(raw)-hashLen-1]); err == nil {
			t.Errorf("record %d: a truncated record decodes", r.N)
		}
	}
	// A damaged head: the record links to it as it reads, and decodes as it was.
	damaged := api.AuditRecord{N: 1, Prev: "not a hash", Received: time.Unix(0, 0).UTC()}
	raw := encodeRecord(&damaged)
	if got, ok, err := decodeRecord(raw); err != nil || !ok || got.Prev != "not a hash" {
		t.Errorf("a record linking to a damaged head: %+v, %v, %v", got, ok, err)
	}
}

// TestEncoding_LogFromBeforeIt: a log written as JSON before the compact encoding goes on in
// the new one; verify reads both, the chain links across, and a change to a record of either
// form is found.
func TestEncoding_LogFromBeforeIt(t *testing.T) {
	l, db, kp := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
	subject := "mesh.mod.m.event.tick"
	event := func(seq int) jetstream.Msg {
		body := []byte(fmt.Sprintf(`{"n":%d}`, seq))
		h, err := envelope.Stamp(kp, "m", "n", subject, body, envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return delivered{subject: subject, header: h, data: body, seq: uint64(seq)}
	}
	// Three records as the JSON log wrote them.
	var old []jetstream.Msg
	err := db.Update(func(tx *bolt.Tx) error {
		h := readHead(tx)
		for seq := 1; seq <= 3; seq++ {
			m := event(seq)
			old = append(old, m)
			r, _ := l.check(m, uint64(seq), time.Now().UTC())
			r.N, r.Prev = h.N+1, h.Hash
			r.Hash = computeHash(r)
			b, _ := json.Marshal(r)
			if err := tx.Bucket(bucketRecords).Put(u64(r.N), b); err != nil {
				return err
			}
			if err := tx.Bucket(bucketIDs).Put([]byte(r.EventID), u64(r.N)); err != nil {
				return err
			}
			if err := index(tx, r); err != nil {
				return err
			}
			h = head{N: r.N, Hash: r.Hash, Seq: r.Seq}
		}
		b, _ := json.Marshal(h)
		return tx.Bucket(bucketMeta).Put([]byte("head"), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	// Two more through the logger, and a redelivery of a JSON-era event (recorded once).
	if _, err := l.write([]jetstream.Msg{old[1], event(4), event(5)}); err != nil {
		t.Fatal(err)
	}
	v, err := l.Verify()
	if err != nil || !v.OK() || v.Records != 5 {
		t.Fatalf("verify of a log in both forms: %d records, broken %+v, flagged %+v, %v", v.Records, v.Broken, v.Flagged, err)
	}
	recs, err := l.Query(api.AuditFilter{Source: "m"})
	if err != nil || len(recs) != 5 || recs[2].Hash != recs[3].Prev || !recs[3].Signed {
		t.Fatalf("query: %+v, %v", recs, err)
	}
	var stored [6][]byte
	db.View(func(tx *bolt.Tx) error {
		for n := uint64(1); n <= 5; n++ {
			stored[n] = bytes.Clone(tx.Bucket(bucketRecords).Get(u64(n)))
		}
		return nil
	})
	if stored[3][0] != '{' || stored[4][0] != compactFormat {
		t.Fatalf("records 3 and 4 begin with %q and %q: want JSON, then the compact form", stored[3][0], stored[4][0])
	}
	// A change to one byte of the subject, in each form.
	for _, n := range []uint64{2, 4} {
		bad := bytes.Clone(stored[n])
		i := bytes.Index(bad, []byte("tick"))
		bad[i] = 't' ^ 0x01
		db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketRecords).Put(u64(n), bad) })
		if v, err := l.Verify(); err != nil || v.Broken == nil || v.Broken.N != n {
			t.Errorf("verify after record %d was altered: broken %+v, %v", n, v.Broken, err)
		}
		db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketRecords).Put(u64(n), stored[n]) })
	}
}

// BenchmarkWrite is the audit log's own cost per event, without a server: batches of 1,024
// events of 256 bytes with a module's envelope, checked and written in one transaction each
// (as Run does), signed (a verification each, on every core) and unsigned (the transaction
// alone: encoding, hash chain, indexes, bbolt).
// Run: go test -run '^$' -bench Write -benchtime 20x ./audit/
func BenchmarkWrite(b *testing.B) {
	for _, signed := range []bool{true, false} {
		name := "unsigned"
		if signed {
			name = "signed"
		}
		b.Run(name, func(b *testing.B) {
			l, db, kp := testLogger(b, filepath.Join(b.TempDir(), "a.db"), nil)
			sk, err := envelope.NewSigningKey(kp)
			if err != nil {
				b.Fatal(err)
			}
			subject := "mesh.mod.m.event.order.placed"
			body := bytes.Repeat([]byte("x"), 256)
			const batch = 1024
			seq := 0
			batches := make([][]jetstream.Msg, b.N)
			for i := range batches {
				for range batch {
					seq++
					h, err := envelope.Stamp(sk, "m", "n", subject, body, envelope.Options{})
					if err != nil {
						b.Fatal(err)
					}
					if !signed {
						h.Del(envelope.Signature)
					}
					batches[i] = append(batches[i], delivered{subject: subject, header: h, data: body, seq: uint64(seq)})
				}
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := l.write(batches[i]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*batch), "µs/event")
			var stored, n int
			db.View(func(tx *bolt.Tx) error {
				return tx.Bucket(bucketRecords).ForEach(func(_, v []byte) error { stored, n = stored+len(v), n+1; return nil })
			})
			b.ReportMetric(float64(stored)/float64(max(n, 1)), "B/record")
		})
	}
}

// TestLogger_Missed: a stream sequence the log never gets (an event evicted or deleted
// before it read it) counts once its gap has stayed open gapConfirm; a late one (delivered
// again after newer ones were written) fills its gap and never counts; a new log's start, and
// what came before the sequence it began counting at, are no gap; the count survives
// reopening.
func TestLogger_Missed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	l, db, kp := testLogger(t, path, nil)
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	l.clock = func() time.Time { return now }
	l.since.Store(30) // EVENTS' last sequence when the log began
	subject := "mesh.mod.m.event.tick"
	msgs := map[uint64]jetstream.Msg{}
	event := func(seq uint64) jetstream.Msg {
		if m, ok := msgs[seq]; ok {
			return m // the same event, delivered again
		}
		h, err := envelope.Stamp(kp, "m", "n", subject, []byte("{}"), envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		msgs[seq] = delivered{subject: subject, header: h, data: []byte("{}"), seq: seq}
		return msgs[seq]
	}
	for _, step := range []struct {
		batch  []uint64
		after  time.Duration // the clock moves on before the batch
		missed uint64
	}{
		{[]uint64{10, 11}, 0, 0},           // a new log reads the stream's history
		{[]uint64{20, 28}, 0, 0},           // holes in the history, before sequence 30: not this log's
		{[]uint64{29, 31, 32, 36}, 0, 0},   // 30 and 33–35 open (30 is history: never counts)
		{[]uint64{34}, time.Second, 0},     // 34 is late, not gone
		{[]uint64{37}, gapConfirm, 2},      // 33 and 35 stayed open: missed
		{[]uint64{40}, time.Second, 2},     // 38–39 open
		{[]uint64{38, 41}, gapConfirm, 3},  // 38 late; 39 missed
		{[]uint64{41, 42}, time.Minute, 3}, // a redelivery, and nothing open
	} {
		now = now.Add(step.after)
		var batch []jetstream.Msg
		for _, s := range step.batch {
			batch = append(batch, event(s))
		}
		if _, err := l.write(batch); err != nil {
			t.Fatal(err)
		}
		if got := l.Missed(); got != step.missed {
			t.Fatalf("after %v: missed %d, want %d (open %v)", step.batch, got, step.missed, l.open)
		}
	}
	// A gap no batch comes to settle counts at the next tick.
	if _, err := l.write([]jetstream.Msg{event(45)}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(gapConfirm)
	l.settleGaps()
	if got := l.Missed(); got != 5 {
		t.Fatalf("after the tick: missed %d, want 5", got)
	}
	db.Close()
	if l, _, _ = testLogger(t, path, kp); l.Missed() != 5 {
		t.Fatalf("reopened: missed %d; want 5", l.Missed())
	}
}

// TestGaps: filling splits a gap, and past maxOpenGaps the oldest count at once.
func TestGaps(t *testing.T) {
	at := time.Now()
	g := gaps{}.see(10, 0, []uint64{20}, at) // 11–19
	for _, s := range []uint64{15, 11, 19, 16} {
		g = g.fill(s)
	}
	if want := (gaps{{lo: 12, hi: 14, since: at}, {lo: 17, hi: 18, since: at}}); !reflect.DeepEqual(g, want) {
		t.Fatalf("gaps %v, want %v", g, want)
	}
	// A new log that began counting after sequence 100: 101–109 went before it read them.
	if fresh := (gaps{}).see(0, 100, []uint64{110, 111}, at); len(fresh) != 1 || fresh[0].lo != 101 || fresh[0].hi != 109 {
		t.Fatalf("a new log's first batch past its floor: %v", fresh)
	}
	if _, missed := g.settle(at.Add(gapConfirm - time.Second)); missed != 0 {
		t.Fatalf("settled %d before gapConfirm", missed)
	}
	var many gaps
	for i := range uint64(maxOpenGaps + 2) {
		many = many.see(2*i+1, 0, []uint64{2*i + 3}, at) // 2i+2 open
	}
	left, missed := many.settle(at)
	if len(left) != maxOpenGaps || missed != 2 || left[0].lo != 6 {
		t.Fatalf("past the bound: %d open, %d missed, first %v", len(left), missed, left[0])
	}
}

// TestLogger_LateEventsCount: an event written after newer ones (a redelivery that filled a
// gap) is new bytes and a new event for its owner's usage, once.
func TestLogger_LateEventsCount(t *testing.T) {
	l, _, kp := testLogger(t, filepath.Join(t.TempDir(), "a.db"), nil)
	var events int
	l.Ingested = func(_ string, n int, _ int64) { events += n }
	subject := "mesh.mod.m.event.tick"
	msgs := map[uint64]jetstream.Msg{}
	for seq := uint64(1); seq <= 7; seq++ {
		h, err := envelope.Stamp(kp, "m", "n", subject, []byte("{}"), envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		msgs[seq] = delivered{subject: subject, header: h, data: []byte("{}"), seq: seq}
	}
	for _, batch := range [][]uint64{{1, 2, 3}, {6, 7}, {4, 5}, {4, 7}} {
		var b []jetstream.Msg
		for _, s := range batch {
			b = append(b, msgs[s])
		}
		if _, err := l.write(b); err != nil {
			t.Fatal(err)
		}
	}
	if events != 7 || l.Records() != 7 {
		t.Fatalf("usage counted %d events, %d records; want 7 and 7", events, l.Records())
	}
}
