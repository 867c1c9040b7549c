package toolstats

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
)

// TestRecorder: each call counts in every bucket at or above its duration; a snapshot says
// whether anything was recorded since the last; Check accepts what a Recorder makes and
// refuses histograms that cannot be.
func TestRecorder(t *testing.T) {
	var r Recorder
	if _, changed := r.Snapshot(); changed {
		t.Fatal("an empty recorder says it changed")
	}
	r.Observe("status", 300*time.Microsecond) // ≤ .0005
	r.Observe("status", 3*time.Millisecond)   // ≤ .005
	r.Observe("status", time.Minute)          // past every bound
	tools, changed := r.Snapshot()
	st := tools["status"]
	if !changed || st.Count != 3 || st.Buckets[0] != 1 || st.Buckets[2] != 1 || st.Buckets[3] != 2 || st.Buckets[len(Buckets)-1] != 2 {
		t.Fatalf("snapshot %+v changed %v", st, changed)
	}
	if st.Sum < 60 || st.Sum > 60.01 {
		t.Fatalf("sum %v", st.Sum)
	}
	if _, changed := r.Snapshot(); changed {
		t.Fatal("a second snapshot with no call between says it changed")
	}
	if err := Check(api.ToolStatsReport{Tools: tools}); err != nil {
		t.Fatalf("a recorder's report refused: %v", err)
	}
	for name, bad := range map[string]api.ToolHistogram{
		"short":          {Count: 1, Buckets: []uint64{1}},
		"not cumulative": {Count: 2, Buckets: append([]uint64{2, 1}, make([]uint64, len(Buckets)-2)...)},
		"over the count": {Count: 1, Buckets: func() []uint64 { b := make([]uint64, len(Buckets)); b[len(b)-1] = 5; return b }()},
		"negative sum":   {Count: 0, Sum: -1, Buckets: make([]uint64, len(Buckets))},
	} {
		if err := Check(api.ToolStatsReport{Tools: map[string]api.ToolHistogram{"t": bad}}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
