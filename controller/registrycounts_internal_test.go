package controller

import (
	"fmt"
	"testing"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
)

// TestDeadTally_CountsAsAWalkWould: kept up to date across registrations, replacements,
// removals and a change of nodes, the tally counts what walking every module's derivation
// counts (the walk checkDead made before: the mesh's consumers, every other module's, and
// the module's as it was and as it would be).
func TestDeadTally_CountsAsAWalkWould(t *testing.T) {
	derive := func(yaml string) *manifest.Derivation {
		t.Helper()
		m, err := manifest.Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		d, err := m.Derive()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	consumer := func(name string) *manifest.Derivation {
		return derive(fmt.Sprintf("module: %s\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\n", name))
	}
	seated := func(name string) *manifest.Derivation {
		return derive(fmt.Sprintf("module: %s\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\n"+
			"seats:\n  %s-q: {scope: node, retain: 1h, accepts: [run]}\n", name, name))
	}
	quiet := func(name string) *manifest.Derivation { // consumes nothing: DEAD keeps nothing of it
		return derive(fmt.Sprintf("module: %s\nrequires: [mesh-bus]\n", name))
	}
	walk := func(entries []*registry.Entry, module string, d *manifest.Derivation, nodes []string) (before, after int) {
		others := map[string]struct{}{}
		cascade := cascadeConsumer()
		others[cascade.Stream+"/"+cascade.Name] = struct{}{}
		deadConsumers(others, manifest.Builtin(), nodes)
		var prev *manifest.Derivation
		for _, e := range entries {
			if e.Module == module {
				prev = e.Derivation
				continue
			}
			deadConsumers(others, e.Derivation, nodes)
		}
		b, a := map[string]struct{}{}, map[string]struct{}{}
		for k := range others {
			b[k], a[k] = struct{}{}, struct{}{}
		}
		deadConsumers(b, prev, nodes)
		deadConsumers(a, d, nodes)
		return len(b), len(a)
	}
	entry := func(module string, d *manifest.Derivation) *registry.Entry {
		return &registry.Entry{Record: registry.Record{Module: module}, Derivation: d}
	}

	var tally deadTally
	var entries []*registry.Entry
	nodes := []string{"alpha"}
	check := func(step, module string, d *manifest.Derivation) {
		t.Helper()
		tally.sync(entries, nodes)
		gotB, gotA := tally.counts(module, d, nodes)
		wantB, wantA := walk(entries, module, d, nodes)
		if gotB != wantB || gotA != wantA {
			t.Errorf("%s: %s as it would be: tally before %d after %d, a walk %d and %d", step, module, gotB, gotA, wantB, wantA)
		}
	}
	check("empty registry", "a", consumer("a"))
	entries = append(entries, entry("a", consumer("a")), entry("b", seated("b")), entry("c", quiet("c")))
	check("new module", "d", seated("d"))
	check("registered again as it was", "b", seated("b"))
	check("registered again without its seat", "b", consumer("b"))
	check("registered again consuming nothing", "a", quiet("a"))
	entries[1] = entry("b", consumer("b")) // b replaced: its seat's consumer goes
	check("after a replacement", "c", seated("c"))
	entries = entries[:1] // b and c removed
	check("after removals", "b", seated("b"))
	nodes = []string{"alpha", "beta", "gamma"} // a node-scoped seat has a consumer on each
	entries = append(entries, entry("e", seated("e")))
	check("more nodes", "f", seated("f"))
}

// TestSyncCatalogue_FollowsTheRegistry: the controller's catalogue holds the registry's
// modules as they are after additions, a replacement and a removal.
func TestSyncCatalogue_FollowsTheRegistry(t *testing.T) {
	entry := func(yaml string) *registry.Entry {
		t.Helper()
		m, err := manifest.Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return &registry.Entry{Record: registry.Record{Module: m.Module}, Manifest: m}
	}
	a := entry("module: a\nrequires: [mesh-bus]\nseats:\n  q: {scope: mesh, retain: 1h, accepts: [work]}\n")
	b := entry("module: b\nrequires: [mesh-bus]\n")
	cat := syncCatalogue(nil, []*registry.Entry{a, b})
	// A seat a declares is taken: another module declaring it is refused.
	taker, _ := manifest.Parse([]byte("module: c\nrequires: [mesh-bus]\nseats:\n  q: {scope: mesh, retain: 1h, accepts: [work]}\n"))
	if err := manifest.CheckCatalogueBound(taker, cat, nil); err == nil {
		t.Fatal("c declaring a's seat q: not refused")
	}
	a2 := entry("module: a\nrequires: [mesh-bus]\n") // a no longer declares q
	cat = syncCatalogue(cat, []*registry.Entry{a2, b})
	if err := manifest.CheckCatalogueBound(taker, cat, nil); err != nil {
		t.Fatalf("c declaring q once a dropped it: %v", err)
	}
	cat = syncCatalogue(cat, []*registry.Entry{b})
	if got, ok := cat.Get("a"); ok || cat.Len() != 1 {
		t.Fatalf("a removed from the registry: the catalogue holds %v (%d modules)", got, cat.Len())
	}
}
