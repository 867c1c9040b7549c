package build_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/manifest"
)

// TestPlan_ExactlyTheDependents (DESIGN §12): a new artifact of base rebuilds exactly a and b
// (built on it), not c; d, built on both, once, after both.
func TestPlan_ExactlyTheDependents(t *testing.T) {
	var catalogue []*manifest.Manifest
	for _, y := range []string{
		"module: base\nbuild: {from: r/base, run: make}\n",
		"module: a\nbuild: {from: r/a, run: make, on: [base]}\n",
		"module: b\nbuild: {from: r/b, run: make, on: [base]}\n",
		"module: c\nbuild: {from: r/c, run: make}\n",
		"module: d\nbuild: {from: r/d, run: make, on: [a, b]}\n",
		"module: e\nbuild: {from: r/e, run: make, on: [d, c]}\n",
		"module: plain\n",
	} {
		m, err := manifest.Parse([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		catalogue = append(catalogue, m)
	}
	g := build.FromCatalogue(catalogue)
	p := g.PlanFrom("base")
	if !slices.Equal(p.Order, []string{"base", "a", "b", "d", "e"}) {
		t.Fatalf("order %v", p.Order)
	}
	if !slices.Equal(p.Needs["d"], []string{"a", "b"}) || !slices.Equal(p.Needs["e"], []string{"d"}) {
		t.Fatalf("needs %v: e waits for d only (c is not rebuilt)", p.Needs)
	}
	built, started := map[string]bool{}, map[string]bool{}
	var rounds [][]string
	for {
		next := p.Ready(built, started)
		if len(next) == 0 {
			break
		}
		rounds = append(rounds, next)
		for _, m := range next {
			started[m] = true
		}
		for _, m := range next {
			built[m] = true
		}
	}
	if fmt.Sprint(rounds) != "[[base] [a b] [d] [e]]" {
		t.Fatalf("rounds %v", rounds)
	}
	// d waits for both sides: with only a built, nothing more is ready.
	if got := p.Ready(map[string]bool{"base": true, "a": true}, map[string]bool{"a": true, "b": true}); len(got) != 0 {
		t.Fatalf("ready with b still building: %v", got)
	}
	if p := g.PlanFrom("c"); !slices.Equal(p.Order, []string{"c", "e"}) {
		t.Fatalf("from c: %v", p.Order)
	}
	if p := g.PlanFrom("e"); !slices.Equal(p.Order, []string{"e"}) {
		t.Fatalf("from e, a leaf: %v", p.Order)
	}
	// A push that changes base and a builds a once, after base: not once for the push and
	// again for base's new artifact.
	if p := g.PlanFrom("a", "base"); !slices.Equal(p.Order, []string{"base", "a", "b", "d", "e"}) || !slices.Equal(p.Needs["a"], []string{"base"}) {
		t.Fatalf("from base and a: %v %v", p.Order, p.Needs)
	}
}

// BenchmarkPlan_1000x10 plans the cascade from the root of a 1,000-module catalogue whose
// build.on graph is 10 deep (100 modules a level, each built on 3 of the level above).
func BenchmarkPlan_1000x10(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	g := build.Graph{"m-0-0": nil}
	for level := 1; level < 10; level++ {
		for i := range 100 {
			var on []string
			for range 3 {
				above := 0
				if level > 1 {
					above = r.IntN(100)
				}
				on = append(on, fmt.Sprintf("m-%d-%d", level-1, above))
			}
			g[fmt.Sprintf("m-%d-%d", level, i)] = slices.Compact(on)
		}
	}
	for i := range 99 {
		g[fmt.Sprintf("m-0-%d", i+1)] = nil
	}
	var p build.Plan
	for b.Loop() {
		p = g.PlanFrom("m-0-0")
	}
	if len(p.Order) < 901 {
		b.Fatalf("planned %d modules", len(p.Order))
	}
}
