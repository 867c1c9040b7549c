package main

import (
	"testing"
	"time"
)

// TestFailedSince: deploy --wait gives up on an instance that could not be prepared only once
// it has stayed failed for failGrace; seen otherwise in between (its node tried again and it
// runs, or prepares again), it starts over.
func TestFailedSince(t *testing.T) {
	f := failedSince{}
	start := time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC)
	for _, step := range []struct {
		key    string
		failed bool
		after  time.Duration
		over   bool
	}{
		{"a/0", true, 0, false},
		{"a/0", true, failGrace - time.Second, false},
		{"b/0", true, failGrace - time.Second, false}, // another instance keeps its own clock
		{"a/0", false, failGrace - time.Second/2, false},
		{"a/0", true, failGrace, false}, // failed again: from here
		{"a/0", true, 2*failGrace - time.Second, false},
		{"a/0", true, 2 * failGrace, true},
		{"b/0", true, 2*failGrace - time.Second, true},
	} {
		if got := f.over(step.key, step.failed, start.Add(step.after)); got != step.over {
			t.Errorf("%s failed %v at +%s: over %v, want %v", step.key, step.failed, step.after, got, step.over)
		}
	}
}
