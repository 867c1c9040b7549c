package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Report is the checks' outcome: one line per check, a summary, and for each anomaly the
// slice of the history that shows it.
type Report struct {
	// Faults counts the faults injected by kind (the nemesis's Counts); the caller sets it so
	// the summary says what the run survived.
	Faults map[string]int

	checks []checkOutcome
	ops    []Op
	lease  leaseCheck
}

// checkOutcome is one check's anomalies.
type checkOutcome struct {
	name      string
	anomalies []Anomaly
}

// maxShown bounds the anomalies String details and the operations of one history slice: a
// run that lost every event needs a few examples, not all of them.
const maxShown = 20

func (r *Report) add(name string, anomalies []Anomaly) {
	r.checks = append(r.checks, checkOutcome{name: name, anomalies: anomalies})
}

// Anomalies returns every check's anomalies, in the order of the checks.
func (r *Report) Anomalies() []Anomaly {
	var out []Anomaly
	for _, c := range r.checks {
		out = append(out, c.anomalies...)
	}
	return out
}

// String renders the report: a line per check, the summary line ("operations: N (…),
// faults: N (…), anomalies: N (…)"), then each anomaly (up to maxShown) with its history slice.
func (r *Report) String() string {
	var b strings.Builder
	for _, c := range r.checks {
		if len(c.anomalies) == 0 {
			fmt.Fprintf(&b, "check %-10s ok\n", c.name)
		} else {
			fmt.Fprintf(&b, "check %-10s %d anomalies\n", c.name, len(c.anomalies))
		}
	}
	opKinds := map[string]int{}
	for _, op := range r.ops {
		opKinds[op.Kind]++
	}
	anomalies := r.Anomalies()
	anomalyKinds := map[string]int{}
	for _, a := range anomalies {
		anomalyKinds[a.Kind]++
	}
	fmt.Fprintf(&b, "operations: %d%s, faults: %d%s, anomalies: %d%s\n",
		len(r.ops), counts(opKinds), total(r.Faults), counts(r.Faults), len(anomalies), counts(anomalyKinds))
	for i, a := range anomalies {
		if i == maxShown {
			fmt.Fprintf(&b, "... and %d more anomalies\n", len(anomalies)-maxShown)
			break
		}
		fmt.Fprintf(&b, "anomaly %s/%s: %s\n", a.Check, a.Kind, a.Msg)
		for _, op := range r.slice(a) {
			fmt.Fprintf(&b, "    %s\n", op)
		}
	}
	return b.String()
}

// slice returns the history around an anomaly: its operations and every other operation on
// the same keys, in invocation order, at most maxShown of them centred on the anomaly's first.
func (r *Report) slice(a Anomaly) []Op {
	mine := map[int]bool{}
	for _, op := range a.Ops {
		mine[op.Seq] = true
	}
	keys := set(a.Keys)
	var out []Op
	for _, op := range r.ops {
		if mine[op.Seq] || keys[op.Key] {
			out = append(out, op)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	if len(out) <= maxShown {
		return out
	}
	first := slices.IndexFunc(out, func(op Op) bool { return mine[op.Seq] })
	start := min(max(first-maxShown/2, 0), len(out)-maxShown)
	return out[start : start+maxShown]
}

// VisualizeLeases writes porcupine's HTML rendering of the lease history to path when the
// lease check found an anomaly (open it in a browser: each seat's operations, the longest
// linearizable prefixes and where they stop), and reports whether it wrote one.
func (r *Report) VisualizeLeases(path string) (bool, error) {
	if len(r.lease.anomalies) == 0 {
		return false, nil
	}
	if err := porcupine.VisualizePath(r.lease.model, r.lease.info, path); err != nil {
		return false, fmt.Errorf("write the lease history's visualization to %s: %w", path, err)
	}
	return true, nil
}

// counts renders " (a 1, b 2)" in key order, or "" when m is empty.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
