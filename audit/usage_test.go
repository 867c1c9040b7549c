package audit

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

func noKeys(string, string, uint64, time.Time) (string, bool) { return "", false }
func noOwners(string, string) bool                            { return false }

// TestLogger_Usage: the bytes each namespace owner holds in EVENTS, counted once per stream
// message (a redelivery adds nothing), kept across a reopen, and aged out with the stream.
func TestLogger_Usage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(db, nil, "n", noKeys, noOwners, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	event := func(seq uint64, subject string, body string, at time.Time) jetstream.Msg {
		return delivered{subject: subject, header: nats.Header{"x-event-id": {subject + body}}, data: []byte(body), seq: seq, at: at}
	}
	batch := []jetstream.Msg{
		event(1, "mesh.mod.a.event.tick", "0123456789", now),
		event(2, "mesh.mod.a.event.tock", "01234", now.Add(-30*time.Hour)),
		event(3, "mesh.mod.b.event.tick", "0", now),
		event(4, "mesh.seat.mailer.event.sent", "01", now),
	}
	if _, err := l.write(batch); err != nil {
		t.Fatal(err)
	}
	if _, err := l.write(batch[:2]); err != nil { // redelivered
		t.Fatal(err)
	}
	cost := func(m jetstream.Msg) int64 { return size(m) }
	want := map[string]int64{"mod.a": cost(batch[0]) + cost(batch[1]), "mod.b": cost(batch[2]), "seat.mailer": cost(batch[3])}
	check := func(l *Logger, want map[string]int64) {
		t.Helper()
		for _, owner := range []string{"mod.a", "mod.b", "seat.mailer", "mod.none"} {
			if got := l.Held(owner); got != want[owner] {
				t.Fatalf("Held(%s)=%d, want %d", owner, got, want[owner])
			}
		}
	}
	check(l, want)
	if got := cost(batch[0]); got < int64(len("mesh.mod.a.event.tick0123456789")) {
		t.Fatalf("an event costs %d bytes, less than its subject and body", got)
	}
	// Reopened: the same usage, from the file.
	db.Close()
	if db, err = bolt.Open(path, 0o600, nil); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if l, err = New(db, nil, "n", noKeys, noOwners, 0, nil); err != nil {
		t.Fatal(err)
	}
	check(l, want)
	// Pruned to a day: the event of 30 hours ago has left EVENTS, for good.
	day := map[string]int64{"mod.a": cost(batch[0]), "mod.b": cost(batch[2]), "seat.mailer": cost(batch[3])}
	if err := l.pruneUsage(24 * time.Hour); err != nil {
		t.Fatal(err)
	}
	check(l, day)
	db.Close()
	if db, err = bolt.Open(path, 0o600, nil); err != nil {
		t.Fatal(err)
	}
	if l, err = New(db, nil, "n", noKeys, noOwners, 0, nil); err != nil {
		t.Fatal(err)
	}
	check(l, day)
}

// TestLogger_UsageFollowsAShortMaxAge: with EVENTS keeping events 10 s, what a module holds
// ages out within a few slices of the stream (of 156 ms), not with the hour: a module
// emitting at a steady rate is counted at what the stream holds, not an hour's worth.
func TestLogger_UsageFollowsAShortMaxAge(t *testing.T) {
	l := newBareLogger(t)
	l.SetEventsMaxAge(10 * time.Second)
	now := time.Now()
	var batch []jetstream.Msg
	for i := range 60 { // one a second for a minute
		batch = append(batch, delivered{subject: "mesh.mod.a.event.tick", header: nats.Header{"x-event-id": {fmt.Sprint(i)}},
			data: []byte("0123456789"), seq: uint64(i + 1), at: now.Add(-time.Duration(59-i) * time.Second)})
	}
	if _, err := l.write(batch); err != nil {
		t.Fatal(err)
	}
	if err := l.pruneUsage(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	one := size(batch[0])
	if got := l.Held("mod.a"); got < 10*one || got > 12*one {
		t.Fatalf("Held=%d after a minute of one event a second in a 10 s stream: want the 10 s it holds (%d), within a slice", got, 10*one)
	}
}

// TestLogger_UsageReadsTheHoursOfBefore: a log written with hourly usage is read as slices of
// an hour, and rewritten so.
func TestLogger_UsageReadsTheHoursOfBefore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	hour := uint32(time.Now().Unix() / 3600)
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketUsage)
		if err != nil {
			return err
		}
		return b.Put(binary.BigEndian.AppendUint32([]byte("mod.a\x00"), hour), binary.BigEndian.AppendUint64(nil, 1234))
	}); err != nil {
		t.Fatal(err)
	}
	l, err := New(db, nil, "n", noKeys, noOwners, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Held("mod.a"); got != 1234 {
		t.Fatalf("Held=%d from an hour of before, want 1234", got)
	}
	db.Close()
	if db, err = bolt.Open(path, 0o600, nil); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if l, err = New(db, nil, "n", noKeys, noOwners, 0, nil); err != nil {
		t.Fatal(err)
	}
	if got := l.Held("mod.a"); got != 1234 {
		t.Fatalf("Held=%d after the rewrite, want 1234", got)
	}
	if err := l.pruneUsage(time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := l.Held("mod.a"); got != 1234 {
		t.Fatalf("Held=%d after a prune: the hour's newest may be this very hour's end", got)
	}
}

// TestLogger_RecordedCountsTheBatch: the admitter's hook is told a batch's new ids before
// Held counts their bytes, and Held counts them once the hook's count has run — the
// admitter runs count under its own lock, so no admission reads the bytes as held and
// pending at once; without the hook, a write counts them itself.
func TestLogger_RecordedCountsTheBatch(t *testing.T) {
	l := newBareLogger(t)
	m := delivered{subject: "mesh.mod.a.event.tick", header: nats.Header{"x-event-id": {"e1"}}, data: []byte("0123456789"), seq: 1, at: time.Now()}
	var before, after int64
	var ids []string
	l.Recorded = func(recorded []string, _ time.Time, count func()) {
		ids, before = recorded, l.Held("mod.a")
		count()
		after = l.Held("mod.a")
	}
	if _, err := l.write([]jetstream.Msg{m}); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != "e1" || before != 0 || after != size(m) {
		t.Fatalf("told %v with Held %d before its count and %d after, want [e1], 0 and %d", ids, before, after, size(m))
	}
	l.Recorded = nil
	m2 := delivered{subject: "mesh.mod.a.event.tick", header: nats.Header{"x-event-id": {"e2"}}, data: []byte("01"), seq: 2, at: time.Now()}
	if _, err := l.write([]jetstream.Msg{m2}); err != nil {
		t.Fatal(err)
	}
	if got := l.Held("mod.a"); got != size(m)+size(m2) {
		t.Fatalf("Held %d with no hook, want %d", got, size(m)+size(m2))
	}
}

// newBareLogger is a logger on a bbolt file of its own, with no keys and no owners: what its
// usage counting needs.
func newBareLogger(t *testing.T) *Logger {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "a.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	l, err := New(db, nil, "n", noKeys, noOwners, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
