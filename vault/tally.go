package vault

import (
	"fmt"
	"maps"
	"time"
)

// FetchedEvery is the least time between two "fetched" events of one secret version. A
// fetch after a quiet FetchedEvery is an event of its own at once; the fetches within
// FetchedEvery of that event are counted and make one event when it has passed, with their
// count and the first and last fetch's time. Each event costs the mesh a signature, a
// store and every node's audit verification — more than the fetch itself — so a module
// fetching in a loop would otherwise spend the cores on its own audit trail.
const FetchedEvery = time.Second

// fetchTally holds the fetches of each secret version that came too soon after its last
// event.
type fetchTally struct {
	every time.Duration
	sent  map[string]time.Time // a version's last event
	held  map[string]*heldFetches
	// sweepAt is the size of sent past which add forgets what it can.
	sweepAt int
}

// heldFetches are fetches counted since a version's last event.
type heldFetches struct {
	meta        map[string]any // the first's
	count       int
	first, last time.Time
}

func newFetchTally(every time.Duration) *fetchTally {
	return &fetchTally{every: every, sent: map[string]time.Time{}, held: map[string]*heldFetches{}, sweepAt: minSweep}
}

// minSweep is the fewest versions remembered before add forgets any.
const minSweep = 1024

// add reports whether e, a "fetched" event at now, is held: false means publish it now.
// A fetch of a version with fetches held joins them, even past FetchedEvery (they are due
// then): published apart, it would come before the older ones.
func (t *fetchTally) add(e event, now time.Time) bool {
	key := fmt.Sprint(e.meta["owner"], "/", e.meta["name"], "/", e.meta["version"])
	h := t.held[key]
	if last, ok := t.sent[key]; h == nil && (!ok || now.Sub(last) >= t.every) {
		t.sent[key] = now
		if len(t.sent) > t.sweepAt {
			t.forget(now)
			t.sweepAt = max(minSweep, 2*len(t.sent))
		}
		return false
	}
	if h == nil {
		h = &heldFetches{meta: e.meta, first: now}
		t.held[key] = h
	}
	h.count++
	h.last = now
	return true
}

// due returns the held fetches whose version's last event is FetchedEvery old (all of
// them with all), each as one event.
func (t *fetchTally) due(now time.Time, all bool) []event {
	var out []event
	for key, h := range t.held {
		if !all && now.Sub(t.sent[key]) < t.every {
			continue
		}
		meta := maps.Clone(h.meta)
		meta["count"] = h.count
		meta["first"] = h.first.UTC().Format(time.RFC3339Nano)
		meta["last"] = h.last.UTC().Format(time.RFC3339Nano)
		out = append(out, event{action: "fetched", meta: meta})
		t.sent[key] = now
		delete(t.held, key)
	}
	return out
}

// next is when the earliest held fetches are due; false when none are held.
func (t *fetchTally) next() (time.Time, bool) {
	var at time.Time
	for key := range t.held {
		if due := t.sent[key].Add(t.every); at.IsZero() || due.Before(at) {
			at = due
		}
	}
	return at, !at.IsZero()
}

// forget drops the versions with nothing held whose last event is FetchedEvery old: their
// next fetch is an event at once anyway.
func (t *fetchTally) forget(now time.Time) {
	for key, last := range t.sent {
		if _, held := t.held[key]; !held && now.Sub(last) >= t.every {
			delete(t.sent, key)
		}
	}
}
