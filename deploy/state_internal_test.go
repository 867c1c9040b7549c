package deploy

import (
	"testing"
	"time"
)

// TestApplied_Behind: a node is behind a declaration when it reported another revision (an
// older one, or a newer one that a STATE made again began below) well after the declaration
// was composed — not when its report may predate it.
func TestApplied_Behind(t *testing.T) {
	composed := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	last := Declaration{Revision: 7, Composed: composed}
	for name, tc := range map[string]struct {
		a    Applied
		want bool
	}{
		"never reported":             {Applied{}, false},
		"applied it":                 {Applied{Revision: 7, Reported: composed.Add(time.Minute)}, false},
		"older, reported just after": {Applied{Revision: 6, Reported: composed.Add(time.Second)}, false},
		"older, reported well after": {Applied{Revision: 6, Reported: composed.Add(RepublishAfter + time.Second)}, true},
		"older, reported before it":  {Applied{Revision: 6, Reported: composed.Add(-time.Minute)}, false},
		"newer (STATE made again)":   {Applied{Revision: 9, Reported: composed.Add(time.Minute)}, true},
		"newer, reported just after": {Applied{Revision: 9, Reported: composed.Add(time.Second)}, false},
	} {
		if got := tc.a.behind(last); got != tc.want {
			t.Errorf("%s: behind=%v, want %v", name, got, tc.want)
		}
	}
}
