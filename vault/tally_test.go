package vault

import (
	"testing"
	"time"
)

// TestFetchTally: a version's first fetch is an event at once; the fetches within a second
// of it are one event when the second has passed, with their count, first and last; a
// fetch after a quiet second is an event at once again; versions are counted apart.
func TestFetchTally(t *testing.T) {
	tally := newFetchTally(time.Second)
	fetched := func(version int) event {
		return event{action: "fetched", meta: map[string]any{"owner": "api", "name": "db", "version": version}}
	}
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	if tally.add(fetched(1), at(0)) {
		t.Fatal("the first fetch was held")
	}
	if _, ok := tally.next(); ok {
		t.Fatal("something is due with nothing held")
	}
	for _, ms := range []int{10, 200, 990} {
		if !tally.add(fetched(1), at(ms)) {
			t.Fatalf("a fetch %d ms after the event was not held", ms)
		}
	}
	if tally.add(fetched(2), at(500)) {
		t.Fatal("another version's first fetch was held")
	}
	if next, ok := tally.next(); !ok || !next.Equal(at(1000)) {
		t.Fatalf("next due %v %v, want %v", next, ok, at(1000))
	}
	if got := tally.due(at(999), false); len(got) != 0 {
		t.Fatalf("due before the second passed: %+v", got)
	}
	got := tally.due(at(1000), false)
	if len(got) != 1 {
		t.Fatalf("due: %+v, want one event", got)
	}
	m := got[0].meta
	if got[0].action != "fetched" || m["count"] != 3 || m["version"] != 1 || m["first"] != "2026-12-02T10:00:00.01Z" || m["last"] != "2026-12-02T10:00:00.99Z" {
		t.Fatalf("the counted event: %s %+v", got[0].action, m)
	}
	// The counted event is the version's last: a fetch within a second of it is held.
	if !tally.add(fetched(1), at(1500)) {
		t.Fatal("a fetch 0.5 s after the counted event was not held")
	}
	if got := tally.due(at(1600), true); len(got) != 1 || got[0].meta["count"] != 1 {
		t.Fatalf("all due at close: %+v", got)
	}
	if tally.add(fetched(1), at(2700)) {
		t.Fatal("a fetch after a quiet second was held")
	}
	// Versions nothing is held for are forgotten once a second old.
	tally.forget(at(4000))
	if len(tally.sent) != 0 {
		t.Fatalf("remembered %v", tally.sent)
	}
}
