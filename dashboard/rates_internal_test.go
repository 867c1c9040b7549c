package dashboard

import (
	"slices"
	"testing"
	"time"
)

// TestRates: the charts' figures are what the counters counted in each interval, from the
// second read on; an hour of intervals at most, the oldest dropped; a counter that went back
// (made again) counts nothing for that interval.
func TestRates(t *testing.T) {
	var events, errors uint64
	r := &rater{read: func() (uint64, uint64) { return events, errors }, every: 10 * time.Minute}
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	r.sample(at)
	if got := r.rates(); got != nil {
		t.Fatalf("rates after one read: %+v, want none", got)
	}
	for i, step := range []struct{ events, errors uint64 }{{5, 0}, {7, 1}, {7, 1}, {2, 0}, {9, 4}, {10, 4}, {30, 5}} {
		events, errors = step.events, step.errors
		r.sample(at.Add(time.Duration(i+1) * 10 * time.Minute))
	}
	got := r.rates()
	if got == nil {
		t.Fatal("no rates after eight reads")
	}
	// Seven intervals, six kept (an hour of ten minutes): 5 2 0 0(went back) 7 1 20 → the first dropped.
	if want := []uint64{2, 0, 0, 7, 1, 20}; !slices.Equal(got.Events, want) {
		t.Errorf("events per interval %v, want %v", got.Events, want)
	}
	if want := []uint64{1, 0, 0, 4, 0, 1}; !slices.Equal(got.Errors, want) {
		t.Errorf("errors per interval %v, want %v", got.Errors, want)
	}
	if got.EveryMS != 600_000 || !got.End.Equal(at.Add(70*time.Minute)) {
		t.Errorf("interval %d ms ending %s, want 600000 ending %s", got.EveryMS, got.End, at.Add(70*time.Minute))
	}
}
