package metrics

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/toolstats"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// TestModuleToolStats: two instances' reports sum per tool; a later report of an instance
// replaces its earlier one; an instance silent for toolStatsStale is forgotten, its counts
// kept; a module inventing instances is bounded.
func TestModuleToolStats(t *testing.T) {
	s := NewModuleTools("alpha", func(module, tool string) bool { return module == "desk" && tool == "status" })
	report := func(instance string, count uint64) {
		var r toolstats.Recorder
		for range count {
			r.Observe("status", time.Millisecond)
		}
		tools, _ := r.Snapshot()
		b, _ := json.Marshal(api.ToolStatsReport{Instance: instance, Node: "alpha", Tools: tools})
		s.Take(&nats.Msg{Subject: "mesh.mod.desk.stats.alpha", Data: b})
	}
	collect := func() (count uint64, series int) {
		reg := prometheus.NewRegistry()
		reg.MustRegister(s)
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				series++
				count += m.GetHistogram().GetSampleCount()
			}
		}
		return count, series
	}
	report("desk-1", 2)
	report("desk-2", 3)
	report("desk-1", 5) // cumulative: replaces its 2
	if count, series := collect(); count != 8 || series != 1 {
		t.Fatalf("count %d in %d series, want 8 in 1", count, series)
	}
	s.mu.Lock()
	r := s.reports["desk"]["desk-2"]
	r.at = time.Now().Add(-toolStatsStale - time.Second)
	s.reports["desk"]["desk-2"] = r
	s.mu.Unlock()
	if count, _ := collect(); count != 8 {
		t.Fatalf("count %d after desk-2 went silent, want 8 still (its 3 retired, not lost: a count never decreases)", count)
	}
	if len(s.reports["desk"]) != 1 {
		t.Fatalf("instances kept %v, want desk-1 alone", s.reports["desk"])
	}
	// A module inventing instances is kept to maxReportingInstances of them.
	for i := range maxReportingInstances + 10 {
		report("forged-"+strconv.Itoa(i), 1)
	}
	if n := len(s.reports["desk"]); n != maxReportingInstances {
		t.Fatalf("%d instances kept, want %d", n, maxReportingInstances)
	}
}
