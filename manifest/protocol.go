package manifest

import (
	"fmt"
	"slices"
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
