package manifest

import (
	"fmt"
	"slices"
	"strings"
)

// CheckCatalogue checks m against the catalogue, the other registered manifests, and returns
// every refusal as Refusals, or nil (rule 6):
//
//   - a seat of m that another module already declares;
//   - a consumed event whose emitter is in the catalogue but does not emit it (a pattern
//     with a wildcard event must match at least one of its emits); an absent emitter is
//     fine, it may be installed later;
//   - an event of m that a module in the catalogue consumes but m does not emit, so the
//     catalogue keeps the rule above from both sides;
//   - with previous, the version of m's module registered now (nil for a new module): a
//     seat protocol change that removes or renames an accept or serve, removes the seat or
//     changes its scope while any other module uses the seat. Additive changes are always
//     accepted.
//
// Catalogue entries for m's own module are ignored; pass the registered one as previous.
// CheckCatalogue assumes m and the catalogue passed Validate.
func CheckCatalogue(m *Manifest, catalogue []*Manifest, previous *Manifest) error {
	v := &validator{m: m}
	v.catalogue(catalogue, previous)
	return v.result()
}

// CheckCatalogueBound is CheckCatalogue for a caller that checks protocol changes with
// CheckBindings, against every bound module at the version it is pinned to (the controller):
// of the protocol checks it keeps only the removal of a seat a module uses.
// The catalogue is indexed (Catalogue), and its entry for m's module is ignored.
func CheckCatalogueBound(m *Manifest, catalogue *Catalogue, previous *Manifest) error {
	v := &validator{m: m, bound: true}
	v.against(catalogue, previous)
	return v.result()
}

// Check runs every check on one manifest's YAML at once — Parse, Validate and CheckCatalogue —
// and returns all refusals as Refusals, in file order, so a user fixes a manifest in one
// pass. The catalogue holds the registered manifests; an entry for the same module is its
// previous version. The manifest is returned even when refused, unless its YAML could not be
// read as a manifest; derive from it only when the error is nil.
func Check(data []byte, catalogue []*Manifest) (*Manifest, error) {
	m, rs := parse(data)
	if m == nil {
		return nil, rs
	}
	var previous *Manifest
	for _, o := range catalogue {
		if o != nil && o.Module == m.Module {
			previous = o
		}
	}
	v := &validator{m: m, rs: rs}
	v.validate()
	v.catalogue(catalogue, previous)
	return m, v.result()
}

func (v *validator) catalogue(catalogue []*Manifest, previous *Manifest) {
	v.against(catalogueOf(catalogue), previous)
}

func (v *validator) against(catalogue *Catalogue, previous *Manifest) {
	c := &catalogueIndex{m: v.m.Module, cat: catalogue}
	c.seats(v)
	c.consumes(v)
	c.consumers(v)
	c.builds(v)
	c.provisioners(v)
	if previous != nil {
		c.protocols(v, previous)
	}
}

// catalogueIndex is the catalogue seen from one module: without its own entry.
type catalogueIndex struct {
	m   string // the module being checked
	cat *Catalogue
}

// module is another module's manifest.
func (c *catalogueIndex) module(name string) (*Manifest, bool) {
	if name == c.m {
		return nil, false
	}
	return c.cat.Get(name)
}

// seatOwner is the other module declaring seat (the first by name, if several do).
func (c *catalogueIndex) seatOwner(seat string) (string, bool) {
	for _, owner := range c.cat.seatOwners[seat] {
		if owner != c.m {
			return owner, true
		}
	}
	return "", false
}

// others is names without the module being checked.
func (c *catalogueIndex) others(names []string) []string {
	if !slices.Contains(names, c.m) {
		return names
	}
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == c.m })
}

// users are the other modules using seat, sorted.
func (c *catalogueIndex) users(seat string) []string { return c.others(c.cat.users[seat]) }

func (c *catalogueIndex) seats(v *validator) {
	for _, s := range v.m.Seats {
		if owner, ok := c.seatOwner(s.Name); ok {
			v.refuse(Refusal{Code: CodeSeatTaken, Field: "seats." + s.Name, Value: s.Name,
				Reason:  "is already declared by module " + owner + "; a seat has one declaring module",
				Instead: "choose another seat name, or write uses: [" + s.Name + "] to send it work"})
		}
	}
}

// consumes refuses patterns naming a present emitter that emits nothing they match.
func (c *catalogueIndex) consumes(v *validator) {
	for i, pattern := range v.m.Consumes {
		emitter, _, _ := strings.Cut(pattern, ".")
		if emitter == SeatEventsPrefix {
			c.seatEvents(v, fmt.Sprintf("consumes[%d]", i), pattern)
			continue
		}
		o, ok := c.module(emitter)
		if !ok {
			continue // a wildcard emitter, the module itself (Validate's), or absent
		}
		subject, err := ConsumeSubject(pattern)
		if err != nil {
			continue
		}
		if len(emitted(subject, emitter, o.Emits)) == 0 {
			v.refuse(notEmitted(fmt.Sprintf("consumes[%d]", i), pattern, emitter, o.Emits))
		}
	}
}

// seatEvents refuses a seat events pattern naming a seat that is declared (in the catalogue,
// by m itself, or built in) but emits nothing the pattern matches. An undeclared seat is
// fine: its module may be registered later.
func (c *catalogueIndex) seatEvents(v *validator, field, pattern string) {
	parts := strings.Split(pattern, ".")
	subject, err := ConsumeSubject(pattern)
	if err != nil || len(parts) < 3 || parts[1] == "*" {
		return
	}
	seat, ok := v.m.Seat(parts[1])
	if owner, declared := c.seatOwner(parts[1]); !ok && declared {
		o, _ := c.module(owner)
		seat, ok = o.Seat(parts[1])
	}
	if !ok {
		seat, ok = BuiltinSeat(parts[1])
	}
	if !ok {
		return
	}
	if seatEmits(seat, subject) {
		return
	}
	r := notEmitted(field, pattern, SeatEventsPrefix+"."+seat.Name, seat.Emits)
	r.Reason = "seat " + strings.TrimPrefix(r.Reason, SeatEventsPrefix+".")
	v.refuse(r)
}

// consumers refuses m when a module of the catalogue consumes, by m's name, an event m does
// not emit: registering m would make the catalogue's consumer wrong.
func (c *catalogueIndex) consumers(v *validator) {
	m := v.m
	// Bound, only the consumers naming m matter; else every seat events consumer too.
	names := c.cat.names
	if v.bound {
		names = c.cat.consumersOf[m.Module]
	}
	for _, name := range c.others(names) {
		o, _ := c.cat.Get(name)
		for _, pattern := range o.Consumes {
			emitter, _, _ := strings.Cut(pattern, ".")
			if emitter == SeatEventsPrefix {
				if !v.bound { // else CheckBindings's, at each consumer's version
					c.seatConsumer(v, name, pattern)
				}
				continue
			}
			if emitter != m.Module {
				continue
			}
			subject, err := ConsumeSubject(pattern)
			if err != nil || len(emitted(subject, m.Module, m.Emits)) > 0 {
				continue
			}
			_, event, _ := strings.Cut(pattern, ".")
			v.refuse(Refusal{Code: CodeNotEmitted, Field: "emits", Value: strings.Join(m.Emits, ", "),
				Reason:  "module " + name + " consumes " + pattern + ", which " + m.Module + " does not emit",
				Instead: "emit " + event + " as well, or correct " + name + "'s consumes first"})
		}
	}
}

// builds refuses a build.on naming a registered module the mesh does not build, a
// registration that stops building a module others are built on, and a build.on that closes
// a cycle across the catalogue (naming it): the cascade must have an order.
// provisioners refuses a module that uses a seat providing an interface, and a seat that
// provides one while modules use it: a provisioner's create, remove and holds are the
// controller's alone — a module that could call create would be handed a credential for
// any consumer it named. A module needing the resource requires the interface.
func (c *catalogueIndex) provisioners(v *validator) {
	m := v.m
	for i, seat := range m.Uses {
		owner, ok := c.seatOwner(seat)
		if !ok {
			continue
		}
		o, _ := c.module(owner)
		s, _ := o.Seat(seat)
		if len(s.Provides) > 0 {
			v.refuse(Refusal{Code: CodeProvider, Field: fmt.Sprintf("uses[%d]", i), Value: seat,
				Reason:  "seat " + seat + " provides " + strings.Join(s.Provides, ", ") + ": its tools are the mesh-controller's alone",
				Instead: "require what it provides instead: requires: [" + strings.Join(append([]string{RequireBus}, s.Provides...), ", ") + "]"})
		}
	}
	for _, s := range m.Seats {
		if users := c.users(s.Name); len(s.Provides) > 0 && len(users) > 0 {
			v.refuse(Refusal{Code: CodeProvider, Field: fmt.Sprintf("seats.%s.provides", s.Name), Value: strings.Join(s.Provides, ", "),
				Reason:  "modules " + strings.Join(users, ", ") + " use seat " + s.Name + ", and a provisioner's tools are the mesh-controller's alone",
				Instead: "have them require " + strings.Join(s.Provides, ", ") + " instead of using the seat, and re-register them first"})
		}
	}
}

func (c *catalogueIndex) builds(v *validator) {
	m := v.m
	for i, on := range m.BuildOn {
		if o, ok := c.module(on); ok && !o.Built() {
			v.refuse(Refusal{Code: CodeBuild, Field: fmt.Sprintf("build.on[%d]", i), Value: on,
				Reason:  "names module " + on + ", which the mesh does not build (it declares no build.from)",
				Instead: "remove it, or give " + on + " a build: {from: ..., run: ...} first"})
		}
	}
	if !m.Built() {
		for _, name := range c.others(c.cat.builtOn[m.Module]) {
			v.refuse(Refusal{Code: CodeBuild, Field: "build", Value: m.Module,
				Reason:  "module " + name + " is built on " + m.Module + ", which would no longer be built",
				Instead: "keep build.from and build.run, or remove " + m.Module + " from " + name + "'s build.on first"})
		}
	}
	on := func(module string) []string {
		if module == m.Module {
			return m.BuildOn
		}
		if o, ok := c.module(module); ok {
			return o.BuildOn
		}
		return nil
	}
	if cycle := buildCycle(m.Module, on); cycle != nil {
		v.refuse(Refusal{Code: CodeBuildCycle, Field: "build.on", Value: strings.Join(m.BuildOn, ", "),
			Reason:  "closes a cycle: " + strings.Join(cycle, " → ") + "; each module would wait for itself",
			Instead: "remove one of these build.on entries"})
	}
}

// buildCycle returns a cycle through start in the build.on graph (start … start), or nil.
func buildCycle(start string, on func(string) []string) []string {
	seen := map[string]bool{}
	var path []string
	var visit func(string) []string
	visit = func(n string) []string {
		path = append(path, n)
		defer func() { path = path[:len(path)-1] }()
		for _, next := range on(n) {
			if next == start {
				return append(slices.Clone(path), start)
			}
			if seen[next] {
				continue
			}
			seen[next] = true
			if c := visit(next); c != nil {
				return c
			}
		}
		return nil
	}
	return visit(start)
}

// seatEmits reports whether seat emits an event the consumed subject pattern matches.
func seatEmits(seat Seat, subject string) bool {
	return slices.ContainsFunc(seat.Emits, func(e string) bool { return covers(subject, SeatEventSubject(seat.Name, e)) })
}

// seatConsumer refuses m when module name consumes, by a seat m declares, an event the seat
// does not emit: m's registration would take the event from under it.
func (c *catalogueIndex) seatConsumer(v *validator, name, pattern string) {
	parts := strings.Split(pattern, ".")
	if len(parts) < 3 {
		return
	}
	seat, ok := v.m.Seat(parts[1])
	subject, err := ConsumeSubject(pattern)
	if !ok || err != nil {
		return
	}
	if seatEmits(seat, subject) {
		return
	}
	v.refuse(Refusal{Code: CodeNotEmitted, Field: "seats." + seat.Name + ".emits", Value: strings.Join(seat.Emits, ", "),
		Reason:  "module " + name + " consumes " + pattern + ", which seat " + seat.Name + " does not emit",
		Instead: "emit " + strings.Join(parts[2:], ".") + " as well, or correct " + name + "'s consumes first"})
}

// protocols refuses changes to a seat's protocol that break the modules using it.
func (c *catalogueIndex) protocols(v *validator, previous *Manifest) {
	m := v.m
	for _, old := range previous.Seats {
		users := c.users(old.Name)
		if len(users) == 0 {
			continue
		}
		who := plural(users, "module ", "modules ") + strings.Join(users, ", ")
		cur, ok := m.Seat(old.Name)
		if !ok {
			v.refuse(Refusal{Code: CodeBreaking, Field: "seats", Value: old.Name,
				Reason:  "removes seat " + old.Name + ", which " + who + " " + plural(users, "uses", "use"),
				Instead: "keep declaring " + old.Name + " until no module uses it"})
			continue
		}
		if v.bound {
			continue
		}
		for _, b := range old.Protocol().Breaks(cur.Protocol()) {
			v.refuse(Refusal{Code: CodeBreaking, Field: "seats." + old.Name + "." + b.Field, Value: b.Value,
				Reason:  fmt.Sprintf("%s of seat %s, which %s %s", b.Reason, old.Name, who, plural(users, "uses", "use")),
				Instead: b.Instead})
		}
	}
}

// Binding is a module bound to a version of the protocol of a seat it uses (Protocol, as the
// registry recorded it when the module registered or was pinned), or whose events it
// consumes by the seat's name (Events).
type Binding struct {
	Module string
	Seat   string
	// Version is the version the module is pinned to: V1 (or "") unless pinned.
	Version string
	// Uses says the module uses the seat, so Protocol is what it relies on.
	Uses     bool
	Protocol Protocol
	// Events are the event patterns of the seat the module consumes by name: the part of
	// seat.<seat>.<event…> after the seat, as a subject pattern (billing.> for billing.**).
	Events []string
}

// CheckBindings refuses m when a seat it declares breaks the version of its protocol a module
// is bound to, whoever declared the seat before: a removed version, a break of the protocol
// a user relies on, or an event a consumer takes by name that the version no longer emits.
// Every refusal names the bound modules.
func CheckBindings(m *Manifest, bound []Binding) error {
	v := &validator{m: m}
	for _, s := range m.Seats {
		type broken struct {
			b    Break
			mods []string
		}
		var found []*broken
		add := func(b Break, module string) {
			i := slices.IndexFunc(found, func(f *broken) bool { return f.b == b })
			if i < 0 {
				found = append(found, &broken{b: b})
				i = len(found) - 1
			}
			if !slices.Contains(found[i].mods, module) {
				found[i].mods = append(found[i].mods, module)
			}
		}
		for _, bd := range bound {
			if bd.Seat != s.Name || bd.Module == m.Module {
				continue
			}
			version := NormalVersion(bd.Version)
			at, ok := s.At(version)
			if !ok {
				add(Break{"versions", version, "removes protocol version " + version,
					"keep declaring " + version + " until `meshnode seat ls` shows it retirable (re-pin its callers with `meshnode seat pin`)"}, bd.Module)
				continue
			}
			if bd.Uses {
				for _, b := range bd.Protocol.Breaks(at.Protocol()) {
					if version != V1 {
						b.Field = "versions." + version + "." + b.Field
					}
					add(b, bd.Module)
				}
			}
			for _, e := range bd.Events {
				if !slices.ContainsFunc(at.Emits, func(em string) bool { return covers(e, em) }) {
					field := "emits"
					if version != V1 {
						field = "versions." + version + ".emits"
					}
					add(Break{field, e, "stops emitting " + e + " (" + version + ")", "keep emitting " + e}, bd.Module)
				}
			}
		}
		for _, f := range found {
			slices.Sort(f.mods)
			v.refuse(Refusal{Code: CodeBreaking, Field: "seats." + s.Name + "." + f.b.Field, Value: f.b.Value,
				Reason: fmt.Sprintf("%s of seat %s, to which %s %s bound", f.b.Reason, s.Name,
					plural(f.mods, "module ", "modules ")+strings.Join(f.mods, ", "), plural(f.mods, "is", "are")),
				Instead: f.b.Instead + ", or re-register them against the new protocol first"})
		}
	}
	return v.result()
}

func plural(xs []string, one, many string) string {
	if len(xs) == 1 {
		return one
	}
	return many
}
