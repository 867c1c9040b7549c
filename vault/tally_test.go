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
	// A fetch of a version with fetches held joins them, even once they are due: published
	// apart, it would come before them.
	tally.add(fetched(1), at(2800))
	if !tally.add(fetched(1), at(3800)) {
		t.Fatal("a fetch of a version with fetches held was not held")
	}
	if got := tally.due(at(3800), false); len(got) != 1 || got[0].meta["count"] != 2 {
		t.Fatalf("due: %+v, want the two held fetches as one", got)
	}
	// Versions nothing is held for are forgotten once a second old.
	tally.forget(at(4900))
	if len(tally.sent) != 0 {
		t.Fatalf("remembered %v", tally.sent)
	}
}

// TestRecordEvents: the loop publishes a version's counted fetches when its second has
// passed even while another version's come due later (the timer moves sooner), a fetch of
// a version with fetches held joins them, other events pass at once, and closing publishes
// everything held.
func TestRecordEvents(t *testing.T) {
	const every = time.Second // long enough that a stalled goroutine (-race, 2 cores) cannot reorder it
	events := make(chan event)
	type published struct {
		e  event
		at time.Duration
	}
	out := make(chan published, 16)
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		recordEvents(events, every, func(e event) { out <- published{e, time.Since(start)} }, func(string) {})
	}()
	fetched := func(name string) event {
		return event{action: "fetched", meta: map[string]any{"owner": "api", "name": name, "version": 1}}
	}
	next := func() published {
		t.Helper()
		select {
		case p := <-out:
			return p
		case <-time.After(5 * time.Second):
			t.Fatal("nothing published")
			return published{}
		}
	}
	sendAt := func(at time.Duration, e event) {
		time.Sleep(time.Until(start.Add(at)))
		events <- e
	}
	sendAt(0, fetched("b")) // b's event, at once
	if p := next(); p.e.meta["name"] != "b" || p.e.meta["count"] != nil {
		t.Fatalf("first: %+v", p.e)
	}
	sendAt(500*time.Millisecond, fetched("a")) // a's event, at once
	if p := next(); p.e.meta["name"] != "a" || p.e.meta["count"] != nil {
		t.Fatalf("second: %+v", p.e)
	}
	sendAt(550*time.Millisecond, fetched("a"))                                    // held: due at 1.5 s
	sendAt(600*time.Millisecond, fetched("b"))                                    // held: due at 1 s, sooner
	sendAt(650*time.Millisecond, event{action: "minted", meta: map[string]any{}}) // not held
	sendAt(700*time.Millisecond, fetched("a"))                                    // joins a's held fetch
	if p := next(); p.e.action != "minted" {
		t.Fatalf("third: %+v", p.e)
	}
	p := next()
	if p.e.meta["name"] != "b" || p.e.meta["count"] != 1 {
		t.Fatalf("fourth: %+v, want b's counted fetch", p.e)
	}
	if p.at < every || p.at >= 1450*time.Millisecond {
		t.Fatalf("b's counted fetch came at %v, due at 1 s: early, or it waited for a's timer", p.at)
	}
	if p := next(); p.e.meta["name"] != "a" || p.e.meta["count"] != 2 || p.at < 1500*time.Millisecond {
		t.Fatalf("fifth: %+v at %v, want a's two counted fetches, not before 1.5 s", p.e, p.at)
	}
	// Held, then closed: published at once.
	sendAt(1750*time.Millisecond, fetched("a"))
	close(events)
	if p := next(); p.e.meta["name"] != "a" || p.e.meta["count"] != 1 {
		t.Fatalf("at close: %+v", p.e)
	}
	<-done
	select {
	case p := <-out:
		t.Fatalf("published after close: %+v", p.e)
	default:
	}
}
