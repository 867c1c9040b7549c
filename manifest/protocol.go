package manifest

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Protocol is what a seat's callers and consumers rely on: its scope (which decides the
// accept subjects), its verbs, tools and events, and their shapes. A module that uses a seat
// is bound to the protocol it registered against (the registry records it); a later
// declaration of the seat, by the same module or another, must not break it.
type Protocol struct {
	Scope   Scope             `json:"scope"`
	Accepts []string          `json:"accepts,omitempty"`
	Serves  []string          `json:"serves,omitempty"`
	Emits   []string          `json:"emits,omitempty"`
	Shapes  map[string]*Shape `json:"shapes,omitempty"`
}

// Protocol returns s's protocol.
func (s Seat) Protocol() Protocol {
	return Protocol{Scope: s.Scope, Accepts: s.Accepts, Serves: s.Serves, Emits: s.Emits, Shapes: s.Shapes}
}

// Break is one way a new protocol breaks a party bound to the old one.
type Break struct {
	Field   string // within the seat: scope, accepts, serves, shapes.<name>
	Value   string
	Reason  string
	Instead string
}

// Breaks lists how next breaks a caller bound to p: a moved scope, a removed (or renamed)
// verb or tool, and each breaking change of their shapes. Additive changes — a new verb,
// tool or optional field — break nothing. Events are not a caller's: a removed event is the
// catalogue's consumers check.
func (p Protocol) Breaks(next Protocol) []Break {
	var out []Break
	if p.Scope != next.Scope {
		out = append(out, Break{"scope", string(next.Scope),
			fmt.Sprintf("moves the seat from %s to %s scope (its work queue moves)", p.Scope, next.Scope),
			"keep scope: " + string(p.Scope)})
	}
	for _, f := range []struct {
		key, noun string
		old, next []string
	}{{"accepts", "accept", p.Accepts, next.Accepts}, {"serves", "serve", p.Serves, next.Serves}} {
		for _, name := range f.old {
			if !slices.Contains(f.next, name) {
				out = append(out, Break{f.key, name, fmt.Sprintf("removes or renames %s %s", f.noun, name),
					fmt.Sprintf("keep %s %s alongside any new one (additive changes are always accepted)", f.noun, name)})
				continue
			}
			for _, r := range p.Shapes[name].breaks(name, next.Shapes[name]) {
				out = append(out, Break{"shapes." + name, name, r,
					"keep the shape's fields, types and values; add only optional fields (or a new " + f.noun + " beside it)"})
			}
		}
	}
	return out
}

// Protocol versions (DESIGN §2, §7). A seat's first protocol, v1, lives on the unversioned
// subjects; a breaking change is made as v2 … v9 beside it, on mesh.seat.<seat>.<version>.….
// The bound is fixed so that EVENTS can capture every version's events with literal
// subjects: nats-server refuses a stream whose subjects overlap, and mesh.seat.*.*.event.>
// would overlap mesh.*.*.event.>.
const (
	// V1 is the first version of every seat's protocol.
	V1 = "v1"
	// MaxVersion is the highest version a seat may declare: v9.
	MaxVersion = 9
)

// LaterVersions are the version names a seat may declare besides v1: v2 … v9.
func LaterVersions() []string {
	out := make([]string, 0, MaxVersion-1)
	for n := 2; n <= MaxVersion; n++ {
		out = append(out, "v"+strconv.Itoa(n))
	}
	return out
}

// validVersion reports whether name is a version a seat may declare besides v1.
func validVersion(name string) bool { return slices.Contains(LaterVersions(), name) }

// NormalVersion returns version with "" read as V1.
func NormalVersion(version string) string {
	if version == "" {
		return V1
	}
	return version
}

// compareVersions orders version names by number: v2 before v10 would be, were it allowed.
func compareVersions(a, b string) int {
	na, _ := strconv.Atoi(strings.TrimPrefix(a, "v"))
	nb, _ := strconv.Atoi(strings.TrimPrefix(b, "v"))
	return cmp.Or(cmp.Compare(na, nb), strings.Compare(a, b))
}

// VersionNames returns the versions s serves: v1, then each later one it declares.
func (s Seat) VersionNames() []string {
	out := []string{V1}
	for _, v := range s.Versions {
		out = append(out, v.Name)
	}
	return out
}

// At returns the seat as its version declares it: the same name, scope and retain, and that
// version's verbs, tools, events and shapes (and no Versions). "" is v1. ok is false when s
// does not declare version.
func (s Seat) At(version string) (Seat, bool) {
	version = NormalVersion(version)
	if version == V1 {
		s.Versions = nil
		return s, true
	}
	for _, v := range s.Versions {
		if v.Name == version {
			return Seat{Name: s.Name, Scope: s.Scope, Retain: s.Retain, Backlog: s.Backlog, Accepts: v.Accepts, Emits: v.Emits, Serves: v.Serves, Shapes: v.Shapes}, true
		}
	}
	return Seat{}, false
}

// each returns every version of s, v1 first, as At returns it, with its name.
func (s Seat) each() []versioned {
	out := make([]versioned, 0, 1+len(s.Versions))
	for _, name := range s.VersionNames() {
		at, _ := s.At(name)
		out = append(out, versioned{name, at})
	}
	return out
}

type versioned struct {
	name string
	seat Seat
}

// ServesTool reports whether any version of s serves tool.
func (s Seat) ServesTool(tool string) bool {
	return slices.Contains(s.Serves, tool) || slices.ContainsFunc(s.Versions, func(v SeatVersion) bool { return slices.Contains(v.Serves, tool) })
}

// ServesCalls reports whether any version of s serves a tool.
func (s Seat) ServesCalls() bool {
	return len(s.Serves) > 0 || slices.ContainsFunc(s.Versions, func(v SeatVersion) bool { return len(v.Serves) > 0 })
}

// AcceptsWork reports whether any version of s accepts work: whether it has a work queue.
func (s Seat) AcceptsWork() bool {
	return len(s.Accepts) > 0 || slices.ContainsFunc(s.Versions, func(v SeatVersion) bool { return len(v.Accepts) > 0 })
}
