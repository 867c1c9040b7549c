// Package build is the build cascade (DESIGN §7, §12): the build.on graph the registered
// manifests hold, and the plan of what one changed module's new artifact makes the mesh
// rebuild — each module downstream exactly once, after every one of its upstreams in the same
// cascade. The planner is a pure function of the graph. The mesh's own seats of the cascade
// run here too, on the nodes that hold them: Git (mesh-git) tells pushes and exports sources,
// Builder (mesh-build-machine) runs builds in the sandbox (Run) and stores their artifacts.
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

// Plan is what a change sets off: the modules whose own source changed (the roots), every
// module downstream of them, each with the upstreams it waits for within the cascade.
type Plan struct {
	// Roots are the modules the cascade starts from.
	Roots []string
	// Order lists every module of the cascade, the roots included, each after all its
	// upstreams in the cascade.
	Order []string
	// Needs are, for each module of Order, the modules of the cascade it is built on: its
	// build starts once each of them has been built.
	Needs map[string][]string
}

// PlanFrom plans the cascade of roots: the roots and every module built, directly or through
// others, on one of them — each once, a module built on two of them after both. Modules on a
// cycle (which registration refuses) are left out.
func (g Graph) PlanFrom(roots ...string) Plan {
	down := map[string][]string{} // who is built on whom, the other way round
	for m, ons := range g {
		for _, on := range ons {
			down[on] = append(down[on], m)
		}
	}
	in := map[string]bool{}
	queue := slices.Clone(roots)
	for _, r := range roots {
		in[r] = true
	}
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
	p := Plan{Roots: slices.Sorted(slices.Values(roots)), Needs: map[string][]string{}}
	remaining := map[string]int{}
	var ready []string
	for m := range in {
		for _, on := range g[m] {
			if in[on] {
				p.Needs[m] = append(p.Needs[m], on)
			}
		}
		slices.Sort(p.Needs[m])
		remaining[m] = len(p.Needs[m])
		if remaining[m] == 0 {
			ready = append(ready, m)
		}
	}
	// Kahn's order, ties by name so that a plan is the same every time.
	for len(ready) > 0 {
		slices.Sort(ready)
		n := ready[0]
		ready = ready[1:]
		p.Order = append(p.Order, n)
		for _, d := range down[n] {
			if in[d] {
				if remaining[d]--; remaining[d] == 0 {
					ready = append(ready, d)
				}
			}
		}
	}
	return p
}

// Ready returns the modules of the plan whose every upstream in the cascade is in built, and
// which are neither built nor started themselves: the next builds to submit.
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
