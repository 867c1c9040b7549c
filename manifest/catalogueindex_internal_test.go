package manifest

import (
	"fmt"
	"reflect"
	"testing"
)

// TestCatalogue_PutAndDeleteIndexAsAFreshIndex: a catalogue kept up to date one change at a
// time — modules added, replaced with other seats, uses and consumes, removed —
// holds the same index as one made afresh from the modules it then holds.
func TestCatalogue_PutAndDeleteIndexAsAFreshIndex(t *testing.T) {
	parse := func(yaml string) *Manifest {
		t.Helper()
		m, err := Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	declarer := func(name, seat string) *Manifest {
		return parse(fmt.Sprintf("module: %s\nrequires: [mesh-bus]\nemits: [thing.done]\nseats:\n  %s: {scope: mesh, retain: 1h, accepts: [work]}\n", name, seat))
	}
	user := func(name, seat, consumes string) *Manifest {
		return parse(fmt.Sprintf("module: %s\nrequires: [mesh-bus]\nuses: [%s]\nconsumes: [%s]\n", name, seat, consumes))
	}
	held := map[string]*Manifest{}
	c := NewCatalogue()
	put := func(m *Manifest) { held[m.Module] = m; c.Put(m) }
	del := func(name string) { delete(held, name); c.Delete(name) }
	check := func(step string) {
		t.Helper()
		var list []*Manifest
		for _, m := range held {
			list = append(list, m)
		}
		if fresh := catalogueOf(list); !reflect.DeepEqual(normal(c), normal(fresh)) {
			t.Errorf("%s: kept %+v\nfresh %+v", step, normal(c), normal(fresh))
		}
	}
	put(declarer("a", "q1"))
	put(user("b", "q1", "a.thing.done"))
	put(user("c", "q1", "a.thing.done"))
	check("added")
	put(declarer("a", "q2")) // a's seat renamed
	put(user("b", "q2", "c.thing.done"))
	check("replaced")
	put(user("b", "q2", "c.thing.done")) // the same again
	check("the same again")
	del("c")
	check("removed")
	del("a")
	del("b")
	check("emptied")
}

// normal is c with empty lists as nil, for comparing.
func normal(c *Catalogue) Catalogue {
	n := *c
	if len(n.names) == 0 {
		n.names = nil
	}
	return n
}
