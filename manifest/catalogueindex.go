package manifest

import (
	"slices"
	"strings"
)

// Catalogue is the registered manifests indexed for CheckCatalogueBound, kept up to date one
// change at a time (Put, Delete): the controller checks every registration against it, and
// indexing the whole registry again for each made registering n modules cost n² (issue 37:
// 10,000 modules). Not safe for concurrent use.
type Catalogue struct {
	modules     map[string]*Manifest
	names       []string            // modules' names, sorted
	seatOwners  map[string][]string // seat → the modules declaring it, sorted
	users       map[string][]string // seat → the modules using it, sorted
	consumersOf map[string][]string // emitter (a consumes pattern's first part) → its consumers, sorted
	builtOn     map[string][]string // module → the modules built on it, sorted
}

// NewCatalogue returns an empty catalogue.
func NewCatalogue() *Catalogue {
	return &Catalogue{modules: map[string]*Manifest{}, seatOwners: map[string][]string{}, users: map[string][]string{},
		consumersOf: map[string][]string{}, builtOn: map[string][]string{}}
}

// catalogueOf indexes a catalogue given as a list; of two entries for one module the first
// counts.
func catalogueOf(list []*Manifest) *Catalogue {
	c := NewCatalogue()
	for _, m := range list {
		if m != nil {
			if _, dup := c.modules[m.Module]; !dup {
				c.Put(m)
			}
		}
	}
	return c
}

// Get returns the module's manifest as the catalogue holds it.
func (c *Catalogue) Get(module string) (*Manifest, bool) {
	m, ok := c.modules[module]
	return m, ok
}

// Len is the number of modules.
func (c *Catalogue) Len() int { return len(c.modules) }

// Put adds m, or replaces the module's manifest with m.
func (c *Catalogue) Put(m *Manifest) {
	if old, ok := c.modules[m.Module]; ok {
		if old == m {
			return
		}
		c.Delete(m.Module)
	}
	c.modules[m.Module] = m
	c.names = insertSorted(c.names, m.Module)
	c.each(m, func(index map[string][]string, key string) { index[key] = insertSorted(index[key], m.Module) })
}

// Delete removes module.
func (c *Catalogue) Delete(module string) {
	m, ok := c.modules[module]
	if !ok {
		return
	}
	delete(c.modules, module)
	c.names = removeSorted(c.names, module)
	c.each(m, func(index map[string][]string, key string) {
		if index[key] = removeSorted(index[key], module); len(index[key]) == 0 {
			delete(index, key)
		}
	})
}

// each calls f with each index and key m is listed under.
func (c *Catalogue) each(m *Manifest, f func(index map[string][]string, key string)) {
	for _, s := range m.Seats {
		f(c.seatOwners, s.Name)
	}
	for _, s := range slices.Compact(slices.Sorted(slices.Values(m.Uses))) {
		f(c.users, s)
	}
	var emitters []string
	for _, p := range m.Consumes {
		emitter, _, _ := strings.Cut(p, ".")
		emitters = append(emitters, emitter)
	}
	for _, e := range slices.Compact(slices.Sorted(slices.Values(emitters))) {
		f(c.consumersOf, e)
	}
	for _, on := range slices.Compact(slices.Sorted(slices.Values(m.BuildOn))) {
		f(c.builtOn, on)
	}
}

func insertSorted(s []string, v string) []string {
	i, found := slices.BinarySearch(s, v)
	if found {
		return s
	}
	return slices.Insert(s, i, v)
}

func removeSorted(s []string, v string) []string {
	i, found := slices.BinarySearch(s, v)
	if !found {
		return s
	}
	return slices.Delete(s, i, i+1)
}
