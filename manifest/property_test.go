package manifest_test

import (
	"math/rand"
	"slices"
	"testing"
	"testing/quick"

	"github.com/meshnode/meshnode/manifest"
)

// quickConfig is seeded so a failure reproduces; raise MaxCount locally to search harder.
func quickConfig() *quick.Config {
	return &quick.Config{MaxCount: 2000, Rand: rand.New(rand.NewSource(29))}
}

// TestProperty_PermissionsStayHome: for any manifest that passes, every derived permission
// lies in its own namespace, a seat it holds, the accept half (and tools) of a seat it uses,
// its inbox, or its own consumers' API subjects (DESIGN §5, design 29 §2).
func TestProperty_PermissionsStayHome(t *testing.T) {
	const node = "n1"
	f := func(vm validManifest) bool {
		m := vm.Manifest
		d, err := m.Derive()
		if err != nil {
			t.Logf("Derive: %v", err)
			return false
		}
		mod := m.Module
		// The consumers the module pulls, as (stream, consumer) pairs.
		type consumer struct{ stream, name string }
		var own []consumer
		if len(m.Consumes) > 0 {
			own = append(own, consumer{"EVENTS", mod})
		}
		perms := d.Permissions
		for _, s := range m.Seats {
			hp, err := d.HolderPermissions(s.Name, node)
			if err != nil {
				t.Logf("HolderPermissions: %v", err)
				return false
			}
			perms = perms.Merge(hp)
			name := "seat-" + s.Name
			if s.Scope == manifest.ScopeNode {
				name += "-" + node
			}
			own = append(own, consumer{"SEAT_" + s.Name, name})
		}

		publishOK := func(p string) bool {
			if p == manifest.StatsSubject(mod, "*") {
				return true
			}
			// What lands in a stream goes through the admitter, under the module's own prefix.
			admitted := func(pattern string) bool { return within(manifest.AdmitSubject(mod, pattern), p) }
			if admitted("mesh.mod." + mod + ".event.>") {
				return true
			}
			for _, s := range m.Seats {
				if admitted("mesh.seat." + s.Name + ".event.>") {
					return true
				}
			}
			for _, s := range m.Uses {
				if admitted("mesh.seat."+s+".accept.>") || admitted("mesh.seat."+s+".node.*.accept.>") || within("mesh.seat."+s+".tool.>", p) {
					return true
				}
			}
			if p == manifest.OperatorInbox+".>" && perms.AllowResponses {
				return true // a module that answers requests answers the operator
			}
			for _, c := range own {
				if slices.Contains([]string{
					"$JS.API.CONSUMER.INFO." + c.stream + "." + c.name,
					"$JS.API.CONSUMER.MSG.NEXT." + c.stream + "." + c.name,
					"$JS.ACK." + c.stream + "." + c.name + ".>",
				}, p) {
					return true
				}
			}
			return false
		}
		for _, p := range perms.Publish {
			if !publishOK(p) {
				t.Logf("%s may publish %q", mod, p)
				return false
			}
		}

		subscribeOK := func(s manifest.Subscription) bool {
			if s.Subject == "_INBOX."+mod+".>" && s.Queue == "" {
				return true
			}
			if within("mesh.mod."+mod+".tool.>", s.Subject) && s.Queue == mod {
				return true
			}
			for _, seat := range m.Seats {
				if within("mesh.seat."+seat.Name+".tool.>", s.Subject) && s.Queue == seat.Name {
					return true
				}
			}
			return false
		}
		for _, s := range perms.Subscribe {
			if !subscribeOK(s) {
				t.Logf("%s may subscribe %+v", mod, s)
				return false
			}
		}
		if perms.AllowResponses && len(m.Tools) == 0 && !slices.ContainsFunc(m.Seats, func(s manifest.Seat) bool { return len(s.Serves) > 0 }) {
			t.Logf("%s may respond with nothing to answer", mod)
			return false
		}
		return true
	}
	if err := quick.Check(f, quickConfig()); err != nil {
		t.Fatal(err)
	}
}

// TestProperty_UsesNeverSubscribes: a module that uses a seat never gets subscribe on any of
// that seat's subjects, its accept subjects above all (design 29 §12: a sender cannot read
// the queue it writes to). Holding a seat of its own is the only way in.
func TestProperty_UsesNeverSubscribes(t *testing.T) {
	f := func(vm validManifest) bool {
		m := vm.Manifest
		d, err := m.Derive()
		if err != nil {
			return false
		}
		perms := d.Permissions
		for _, s := range m.Seats {
			hp, _ := d.HolderPermissions(s.Name, "n1")
			perms = perms.Merge(hp)
		}
		for _, seat := range m.Uses {
			if _, held := m.Seat(seat); held {
				continue
			}
			for _, s := range perms.Subscribe {
				if collide(s.Subject, "mesh.seat."+seat+".>") {
					t.Logf("%s uses %s and may subscribe %q", m.Module, seat, s.Subject)
					return false
				}
			}
		}
		for _, seat := range m.Uses { // held or not, the module's own permissions never read a seat
			for _, s := range d.Permissions.Subscribe {
				if collide(s.Subject, "mesh.seat."+seat+".accept.>") || collide(s.Subject, "mesh.seat."+seat+".node.*.accept.>") {
					t.Logf("%s may subscribe %q without holding %s", m.Module, s.Subject, seat)
					return false
				}
			}
		}
		return true
	}
	if err := quick.Check(f, quickConfig()); err != nil {
		t.Fatal(err)
	}
}

// TestProperty_EventsNeverCaptureTools: no derived filter on EVENTS (nor the stream itself)
// matches a tool subject or a work item, and a consumer's filters never lie within one
// another (JetStream error 10138).
func TestProperty_EventsNeverCaptureTools(t *testing.T) {
	f := func(vm validManifest, other validManifest) bool {
		m := vm.Manifest
		d, err := m.Derive()
		if err != nil {
			return false
		}
		var filters []string
		if d.EventsConsumer != nil {
			filters = d.EventsConsumer.FilterSubjects
		}
		filters = append(filters, manifest.EventsStream().Subjects...)
		var tools []string
		for _, mm := range []*manifest.Manifest{m, other.Manifest} {
			for _, t := range mm.Tools {
				tools = append(tools, manifest.ToolSubject(mm.Module, t))
			}
			for _, s := range mm.Seats {
				for _, v := range s.Serves {
					tools = append(tools, manifest.SeatToolSubject(s.Name, v))
				}
				for _, v := range s.Accepts {
					tools = append(tools, manifest.SeatAcceptSubject(s.Name, v), manifest.SeatNodeAcceptSubject(s.Name, "n1", v))
				}
			}
		}
		for _, f := range filters {
			for _, tool := range tools {
				if match(f, tool) {
					t.Logf("filter %q matches %q", f, tool)
					return false
				}
			}
			for _, kind := range []string{"mesh.*.*.tool.>", "mesh.seat.*.accept.>", "mesh.seat.*.node.*.accept.>"} {
				if collide(f, kind) {
					t.Logf("filter %q collides with %q", f, kind)
					return false
				}
			}
		}
		if d.EventsConsumer != nil {
			fs := d.EventsConsumer.FilterSubjects
			for i, a := range fs {
				for j, b := range fs {
					if i != j && within(a, b) {
						t.Logf("filter %q lies within %q", b, a)
						return false
					}
				}
			}
			// Minimal, but nothing lost: every declared pattern lies within a filter.
			for _, c := range d.Consumes {
				if !slices.ContainsFunc(fs, func(f string) bool { return within(f, c.Subject) }) {
					t.Logf("%q is not delivered", c.Name)
					return false
				}
			}
		}
		return true
	}
	if err := quick.Check(f, quickConfig()); err != nil {
		t.Fatal(err)
	}
}

// TestProperty_ParseRoundTrip: a valid manifest written as YAML parses back to the same
// declaration and derivation.
func TestProperty_ParseRoundTrip(t *testing.T) {
	f := func(vm validManifest) bool {
		m := vm.Manifest
		back, err := manifest.Parse(marshal(m))
		if err != nil {
			t.Logf("Parse: %v\n%s", err, marshal(m))
			return false
		}
		a, err1 := m.Derive()
		b, err2 := back.Derive()
		if err1 != nil || err2 != nil {
			t.Logf("Derive: %v, %v", err1, err2)
			return false
		}
		return slices.Equal(a.Permissions.Publish, b.Permissions.Publish) &&
			slices.Equal(a.Permissions.Subscribe, b.Permissions.Subscribe) &&
			len(a.Seats) == len(b.Seats)
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 300, Rand: rand.New(rand.NewSource(7))}); err != nil {
		t.Fatal(err)
	}
}
