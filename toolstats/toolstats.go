// Package toolstats is how the latency of a module's own tools reaches the node it is
// connected to. A tool call goes from caller to module over the bus, past every node, so no
// node can time it; the module's sdk times each call its handlers answer and, every Interval
// while it serves any, publishes a report (api.ToolStatsReport) of its cumulative histograms
// on manifest.StatsSubject(module) (core NATS, never stored; the bus lets a module publish
// there only for itself). The node checks each report against the module's declared tools
// and exports the sum over its instances as meshnode_module_tool_call_duration_seconds.
package toolstats

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
)

// Buckets are the histograms' upper bounds, in seconds: from half a millisecond to 10 s.
var Buckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Interval is how often an instance that served calls reports.
const Interval = 10 * time.Second

// Heartbeat is how often an instance that answered any call reports even when it answered
// none since: its node keeps an instance's counts while it hears from it.
const Heartbeat = time.Minute

// MaxBytes bounds a report: a node reads no larger one.
const MaxBytes = 64 << 10

// SeatTool is a seat's tool's name in a report.
func SeatTool(seat, tool string) string { return "seat." + seat + "." + tool }

// Check refuses a report whose histograms cannot be right: a bucket list of another length,
// counts that decrease along the bounds or exceed the total, a negative or non-finite sum.
func Check(r api.ToolStatsReport) error {
	for name, t := range r.Tools {
		if len(t.Buckets) != len(Buckets) {
			return fmt.Errorf("tool %s: %d buckets, want %d", name, len(t.Buckets), len(Buckets))
		}
		if !slices.IsSorted(t.Buckets) || t.Buckets[len(t.Buckets)-1] > t.Count {
			return fmt.Errorf("tool %s: bucket counts are not cumulative within the count", name)
		}
		if !(t.Sum >= 0 && t.Sum < 1e15) {
			return fmt.Errorf("tool %s: sum %v", name, t.Sum)
		}
	}
	return nil
}

// Recorder keeps an instance's histograms. The zero value is ready.
type Recorder struct {
	mu      sync.Mutex
	tools   map[string]*api.ToolHistogram
	changed bool
}

// Observe records one call of tool that took d.
func (r *Recorder) Observe(tool string, d time.Duration) {
	s := d.Seconds()
	i := sort.SearchFloat64s(Buckets, s) // the first bound ≥ s
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tools == nil {
		r.tools = map[string]*api.ToolHistogram{}
	}
	t := r.tools[tool]
	if t == nil {
		t = &api.ToolHistogram{Buckets: make([]uint64, len(Buckets))}
		r.tools[tool] = t
	}
	t.Count++
	t.Sum += s
	for j := i; j < len(Buckets); j++ {
		t.Buckets[j]++
	}
	r.changed = true
}

// Snapshot returns a copy of the histograms, and whether a call was recorded since the last
// snapshot.
func (r *Recorder) Snapshot() (map[string]api.ToolHistogram, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]api.ToolHistogram, len(r.tools))
	for name, t := range r.tools {
		out[name] = api.ToolHistogram{Count: t.Count, Sum: t.Sum, Buckets: slices.Clone(t.Buckets)}
	}
	changed := r.changed
	r.changed = false
	return out, changed
}
