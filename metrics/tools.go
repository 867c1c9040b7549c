package metrics

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/toolstats"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// toolStatsStale is how long an instance's last report counts after it stopped reporting:
// an instance reports while it serves calls, so one silent this long has gone (or idles, and
// its counts come back with its next call).
const toolStatsStale = 5 * time.Minute

// maxReportingInstances bounds the instances of one module whose reports a node keeps.
const maxReportingInstances = 256

// ModuleTools is the latency of the modules' own tools, as the instances connected to
// this node report it (toolstats), summed per module and tool:
// meshnode_module_tool_call_duration_seconds{module,tool}. Only tools the module declares
// are kept, so the series are bounded by the registrations.
type ModuleTools struct {
	node     string
	declares func(module, tool string) bool

	mu      sync.Mutex
	reports map[string]map[string]instanceReport // module → instance → its last report
	// retired are the counts of the instances forgotten (silent for toolStatsStale), by
	// module and tool: added to the live ones, so that the exported counts never decrease.
	retired map[string]map[string]api.ToolHistogram
}

type instanceReport struct {
	tools map[string]api.ToolHistogram
	at    time.Time
}

var moduleToolDesc = prometheus.NewDesc("meshnode_module_tool_call_duration_seconds",
	"How long modules' own tools (and their seats' tools, as seat.<seat>.<tool>) take to answer, as the instances connected to this node time their handlers.",
	[]string{"module", "tool"}, nil)

func NewModuleTools(node string, declares func(module, tool string) bool) *ModuleTools {
	return &ModuleTools{node: node, declares: declares, reports: map[string]map[string]instanceReport{},
		retired: map[string]map[string]api.ToolHistogram{}}
}

// take is the handler of manifest.StatsSubject("*"): the bus lets only a module publish its
// own, so the subject names the reporter; the report is untrusted input all the same.
func (s *ModuleTools) Take(m *nats.Msg) {
	module, ok := strings.CutSuffix(strings.TrimPrefix(m.Subject, "mesh.mod."), ".stats."+s.node)
	if !ok || len(m.Data) > toolstats.MaxBytes {
		return
	}
	var r api.ToolStatsReport
	if json.Unmarshal(m.Data, &r) != nil || r.Node != s.node || r.Instance == "" || len(r.Instance) > 128 || toolstats.Check(r) != nil {
		return // another node's instance, or not a report
	}
	for tool := range r.Tools {
		if !s.declares(module, tool) {
			delete(r.Tools, tool)
		}
	}
	if len(r.Tools) == 0 {
		return // nothing it declares (nor a module registered)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reports[module] == nil {
		s.reports[module] = map[string]instanceReport{}
	}
	if _, known := s.reports[module][r.Instance]; !known && len(s.reports[module]) >= maxReportingInstances {
		s.retire(module)
		if len(s.reports[module]) >= maxReportingInstances {
			return // a module inventing instances gets no more memory
		}
	}
	s.reports[module][r.Instance] = instanceReport{tools: r.Tools, at: time.Now()}
}

func (s *ModuleTools) Describe(ch chan<- *prometheus.Desc) { ch <- moduleToolDesc }

// retire forgets module's instances silent for toolStatsStale, keeping their counts. Under mu.
func (s *ModuleTools) retire(module string) {
	for instance, r := range s.reports[module] {
		if time.Since(r.at) <= toolStatsStale {
			continue
		}
		if s.retired[module] == nil {
			s.retired[module] = map[string]api.ToolHistogram{}
		}
		for tool, t := range r.tools {
			s.retired[module][tool] = add(s.retired[module][tool], t)
		}
		delete(s.reports[module], instance)
	}
	if len(s.reports[module]) == 0 {
		delete(s.reports, module)
	}
}

// add returns the histogram of a and b together.
func add(a, b api.ToolHistogram) api.ToolHistogram {
	out := api.ToolHistogram{Count: a.Count + b.Count, Sum: a.Sum + b.Sum, Buckets: make([]uint64, len(toolstats.Buckets))}
	for i := range out.Buckets {
		if i < len(a.Buckets) {
			out.Buckets[i] += a.Buckets[i]
		}
		out.Buckets[i] += b.Buckets[i]
	}
	return out
}

func (s *ModuleTools) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	modules := map[string]bool{}
	for module := range s.reports {
		modules[module] = true
	}
	for module := range s.retired {
		modules[module] = true
	}
	for _, module := range slices.Sorted(maps.Keys(modules)) {
		s.retire(module)
		sums := map[string]api.ToolHistogram{}
		for tool, t := range s.retired[module] {
			sums[tool] = t
		}
		for _, r := range s.reports[module] {
			for tool, t := range r.tools {
				sums[tool] = add(sums[tool], t)
			}
		}
		for tool, t := range sums {
			if !s.declares(module, tool) {
				delete(s.retired[module], tool) // removed, or no longer declared: not exported
				continue
			}
			buckets := make(map[float64]uint64, len(t.Buckets))
			for i, n := range t.Buckets {
				buckets[toolstats.Buckets[i]] = n
			}
			ch <- prometheus.MustNewConstHistogram(moduleToolDesc, t.Count, t.Sum, buckets, module, tool)
		}
		if len(s.retired[module]) == 0 {
			delete(s.retired, module)
		}
	}
}

// DeclaresTool reports whether module declares tool: one of its tools, or seat.<seat>.<tool>
// for a tool one of its seats serves (in any version).
func DeclaresTool(m *manifest.Manifest, tool string) bool {
	if slices.Contains(m.Tools, tool) {
		return true
	}
	rest, ok := strings.CutPrefix(tool, "seat.")
	if !ok {
		return false
	}
	seat, name, ok := strings.Cut(rest, ".")
	if !ok {
		return false
	}
	s, ok := m.Seat(seat)
	return ok && s.ServesTool(name)
}
