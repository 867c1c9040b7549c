// Package build is the build cascade (DESIGN §7, §12): the build.on graph the registered
// manifests hold, and the plan of what one changed module's new artifact makes the mesh
// rebuild — each module downstream exactly once, after every one of its upstreams in the same
// cascade. The planner is a pure function of the graph.
package build

import (
	"slices"

	"github.com/meshnode/meshnode/manifest"
)

// Graph is the build.on graph: for each module the mesh builds, the modules it is built on.
type Graph map[string][]string

// FromCatalogue returns the graph of the catalogue's built modules.
func FromCatalogue(catalogue []*manifest.Manifest) Graph {
	g := Graph{}
	for _, m := range catalogue {
		if m != nil && m.Built() {
			g[m.Module] = slices.Clone(m.BuildOn)
		}
	}
	return g
}

// Plan is what one changed module sets off: every module downstream of it, each with the
// upstreams it waits for within the cascade.
type Plan struct {
	// Root is the module whose new artifact started the cascade.
	Root string
	// Order lists the downstream modules in an order that puts each after all its upstreams
	// in the cascade (the root excluded).
	Order []string
	// Needs are, for each module of Order, the modules of the cascade (the root or others of
	// Order) it is built on: its rebuild starts once each of them has been built.
	Needs map[string][]string
}

// PlanFrom plans the cascade of root's new artifact: the modules that are built, directly or
// through others, on root. Modules on a cycle (which registration refuses) are left out.
func (g Graph) PlanFrom(root string) Plan {
	// Who is built on whom, the other way round.
	down := map[string][]string{}
	for m, ons := range g {
		for _, on := range ons {
			down[on] = append(down[on], m)
		}
	}
	in := map[string]bool{root: true}
	queue := []string{root}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, d := range down[n] {
			if !in[d] {
				in[d] = true
				queue = append(queue, d)
			}
		}
	}
	p := Plan{Root: root, Needs: map[string][]string{}}
	remaining := map[string]int{}
	for m := range in {
		if m == root {
			continue
		}
		for _, on := range g[m] {
			if in[on] {
				p.Needs[m] = append(p.Needs[m], on)
			}
		}
		slices.Sort(p.Needs[m])
		remaining[m] = len(p.Needs[m])
	}
	// Kahn's order from the root, ties by name so that a plan is the same every time.
	ready := []string{root}
	done := map[string]bool{}
	for len(ready) > 0 {
		slices.Sort(ready)
		n := ready[0]
		ready = ready[1:]
		if done[n] {
			continue
		}
		done[n] = true
		if n != root {
			p.Order = append(p.Order, n)
		}
		for _, d := range down[n] {
			if !in[d] || done[d] {
				continue
			}
			if remaining[d]--; remaining[d] == 0 {
				ready = append(ready, d)
			}
		}
	}
	return p
}

// Ready returns the modules of the plan whose every upstream in the cascade is in built, and
// which are not built or started themselves: the next rebuilds to submit.
func (p Plan) Ready(built, started map[string]bool) []string {
	var out []string
	for _, m := range p.Order {
		if built[m] || started[m] {
			continue
		}
		if !slices.ContainsFunc(p.Needs[m], func(on string) bool { return !built[on] }) {
			out = append(out, m)
		}
	}
	return out
}
