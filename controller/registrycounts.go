package controller

import (
	"maps"
	"slices"
	"strings"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
)

// deadTally counts the consumers whose letters DEAD keeps (deadConsumers) across the
// registry, brought up to date with what changed since it was last asked rather than walked
// afresh: every registration asks it, and walking every module's derivation made
// registering n modules cost n² (issue 37: 10,000 modules). Guarded by Controller.mu.
type deadTally struct {
	nodes   string              // the nodes it counts node-scoped seats' consumers on, joined
	gen     uint64              // the latest sync
	modules map[string]*tallied // what each registered module adds, by module
	refs    map[string]int      // consumer (stream/name) → how many of the mesh's and modules' name it
}

// tallied is one module's derivation as the tally counted it.
type tallied struct {
	d    *manifest.Derivation
	keys []string // its consumers, each once
	gen  uint64   // the sync that last saw it registered
}

// deadKeys are the consumers whose letters DEAD keeps for d, each once.
func deadKeys(d *manifest.Derivation, nodes []string) []string {
	set := map[string]struct{}{}
	deadConsumers(set, d, nodes)
	return slices.Collect(maps.Keys(set))
}

// sync brings the tally to entries, the registry's modules, with nodes: only the modules
// whose entry changed are counted again.
func (t *deadTally) sync(entries []*registry.Entry, nodes []string) {
	if joined := strings.Join(nodes, ","); t.refs == nil || joined != t.nodes {
		*t = deadTally{nodes: joined, modules: map[string]*tallied{}, refs: map[string]int{}}
		mesh := map[string]struct{}{} // the mesh's own: the cascade's, the built-in seats'
		cascade := cascadeConsumer()
		mesh[cascade.Stream+"/"+cascade.Name] = struct{}{}
		deadConsumers(mesh, manifest.Builtin(), nodes)
		t.add(slices.Collect(maps.Keys(mesh)))
	}
	t.gen++
	for _, e := range entries {
		m := t.modules[e.Module]
		if m != nil && m.d == e.Derivation {
			m.gen = t.gen
			continue
		}
		if m != nil {
			t.drop(m.keys)
		}
		m = &tallied{d: e.Derivation, keys: deadKeys(e.Derivation, nodes), gen: t.gen}
		t.add(m.keys)
		t.modules[e.Module] = m
	}
	for name, m := range t.modules {
		if m.gen != t.gen { // removed
			t.drop(m.keys)
			delete(t.modules, name)
		}
	}
}

func (t *deadTally) add(keys []string) {
	for _, k := range keys {
		t.refs[k]++
	}
}

func (t *deadTally) drop(keys []string) {
	for _, k := range keys {
		if t.refs[k]--; t.refs[k] <= 0 {
			delete(t.refs, k)
		}
	}
}

// counts are the consumers DEAD keeps for with module as it is registered (before) and as d
// (after): the mesh's, every other module's, and module's.
func (t *deadTally) counts(module string, d *manifest.Derivation, nodes []string) (before, after int) {
	before = len(t.refs)
	others := len(t.refs)
	var onlyPrev map[string]bool // consumers module's registration alone names
	if m := t.modules[module]; m != nil {
		onlyPrev = map[string]bool{}
		for _, k := range m.keys {
			if t.refs[k] == 1 {
				others--
				onlyPrev[k] = true
			}
		}
	}
	after = others
	for _, k := range deadKeys(d, nodes) {
		if t.refs[k] == 0 || onlyPrev[k] {
			after++
		}
	}
	return before, after
}

// syncCatalogue brings cat to entries, the registry's modules: a changed module's manifest
// is put again, and after a removal the catalogue is indexed afresh (removals are rare,
// registrations many). It returns the catalogue, made when cat is nil.
func syncCatalogue(cat *manifest.Catalogue, entries []*registry.Entry) *manifest.Catalogue {
	if cat == nil {
		cat = manifest.NewCatalogue()
	}
	for _, e := range entries {
		if m, ok := cat.Get(e.Module); !ok || m != e.Manifest {
			cat.Put(e.Manifest)
		}
	}
	if cat.Len() > len(entries) {
		return syncCatalogue(nil, entries)
	}
	return cat
}
