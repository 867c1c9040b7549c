package audit

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

func noKeys(string, string) (string, bool) { return "", false }
func noOwners(string, string) bool         { return false }

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
	check := func(l *Logger, maxAge time.Duration, want map[string]int64) {
		t.Helper()
		got := l.Usage(maxAge)
		if len(got) != len(want) {
			t.Fatalf("Usage(%s)=%v, want %v", maxAge, got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("Usage(%s)=%v, want %v", maxAge, got, want)
			}
		}
	}
	check(l, 7*24*time.Hour, want)
	if got := cost(batch[0]); got < int64(len("mesh.mod.a.event.tick0123456789")) {
		t.Fatalf("an event costs %d bytes, less than its subject and body", got)
	}
	// A day's max age: the event of 30 hours ago has left EVENTS.
	day := map[string]int64{"mod.a": cost(batch[0]), "mod.b": cost(batch[2]), "seat.mailer": cost(batch[3])}
	check(l, 24*time.Hour, day)

	// Reopened: the same usage, from the file.
	db.Close()
	if db, err = bolt.Open(path, 0o600, nil); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if l, err = New(db, nil, "n", noKeys, noOwners, 0, nil); err != nil {
		t.Fatal(err)
	}
	check(l, 7*24*time.Hour, want)
	// Pruned to a day: the old hour is gone for good, even for a longer question.
	if err := l.pruneUsage(24 * time.Hour); err != nil {
		t.Fatal(err)
	}
	check(l, 7*24*time.Hour, day)
	db.Close()
	if db, err = bolt.Open(path, 0o600, nil); err != nil {
		t.Fatal(err)
	}
	if l, err = New(db, nil, "n", noKeys, noOwners, 0, nil); err != nil {
		t.Fatal(err)
	}
	check(l, 7*24*time.Hour, day)
}
