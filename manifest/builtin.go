package manifest

import (
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// BuiltinModule is the name the built-in manifest declares the mesh's own seats under: a
// reserved module name, so no module can register as it.
const BuiltinModule = "mesh"

//go:embed builtin.yaml
var builtinYAML []byte

// builtinParts is the built-in manifest, parsed and validated once, and its derivation.
type builtinParts struct {
	m *Manifest
	d *Derivation
}

// builtinOnce loads builtinParts; a plain Once, since the validation it runs refers back to
// the built-in seats (for modules' mesh-* seats, which the built-in manifest skips).
var (
	builtinOnce  sync.Once
	builtinValue builtinParts
	builtinErr   error
)

func builtin() (builtinParts, error) {
	builtinOnce.Do(func() { builtinValue, builtinErr = loadBuiltin() })
	return builtinValue, builtinErr
}

func loadBuiltin() (builtinParts, error) {
	m, err := Parse(builtinYAML)
	if err != nil {
		return builtinParts{}, fmt.Errorf("the built-in manifest: %w", err)
	}
	v := &validator{m: m, builtin: true}
	v.validate()
	if err := v.result(); err != nil {
		return builtinParts{}, fmt.Errorf("the built-in manifest: %w", err)
	}
	return builtinParts{m, derive(m, nil)}, nil
}

func builtinOrPanic() builtinParts {
	b, err := builtin()
	if err != nil {
		panic(err) // builtin.yaml is part of the binary; its test keeps it valid
	}
	return b
}

// Builtin returns the derivation of the built-in manifest: the mesh's own seats with their
// subjects, work queues and consumers, made by the same code as any module's.
func Builtin() *Derivation { return builtinOrPanic().d }

// BuiltinManifest returns the built-in manifest, parsed.
func BuiltinManifest() *Manifest { return builtinOrPanic().m }

// BuiltinSeat returns the built-in declaration of the mesh's own seat name.
func BuiltinSeat(name string) (Seat, bool) { return builtinOrPanic().m.Seat(name) }

// NodeHeldSeats are the mesh's own seats only nodes hold: a module may not replace them.
var NodeHeldSeats = []string{ControllerSeat, VaultSeat}

// meshSeat checks a module's declaration of a mesh-* seat: it must be one of the mesh's
// own, one a module may hold, declared with at least the built-in protocol (same scope,
// every verb, tool and event of it).
func (v *validator) meshSeat(field string, s Seat) {
	builtin, ok := BuiltinSeat(s.Name)
	var names []string
	for _, b := range builtinOrPanic().m.Seats {
		if !slices.Contains(NodeHeldSeats, b.Name) {
			names = append(names, b.Name)
		}
	}
	switch {
	case !ok:
		v.refuse(Refusal{Code: CodeReserved, Field: field, Value: s.Name,
			Reason:  "mesh-* seats are the mesh's own, and this is none of them",
			Instead: "choose another name, e.g. " + strings.TrimPrefix(s.Name, reservedSeatPrefix) + ", or declare one the mesh lets a module hold: " + strings.Join(names, ", ")})
		return
	case slices.Contains(NodeHeldSeats, s.Name):
		v.refuse(Refusal{Code: CodeReserved, Field: field, Value: s.Name,
			Reason:  "is held by the nodes themselves; a module cannot replace its holder",
			Instead: "write uses: [" + s.Name + "] to send it work"})
		return
	}
	if s.Scope != builtin.Scope {
		v.refuse(Refusal{Code: CodeReserved, Field: field + ".scope", Value: string(s.Scope),
			Reason:  "differs from the mesh's own " + s.Name + ", whose scope is " + string(builtin.Scope),
			Instead: "write scope: " + string(builtin.Scope)})
	}
	for _, part := range []struct {
		key       string
		got, want []string
	}{{"accepts", s.Accepts, builtin.Accepts}, {"serves", s.Serves, builtin.Serves}, {"emits", s.Emits, builtin.Emits}} {
		var missing []string
		for _, w := range part.want {
			if !slices.Contains(part.got, w) {
				missing = append(missing, w)
			}
		}
		if len(missing) > 0 {
			v.refuse(Refusal{Code: CodeReserved, Field: field + "." + part.key,
				Reason:  "lacks " + strings.Join(missing, ", ") + " of the mesh's own " + s.Name + " protocol; a replacement holder implements all of it",
				Instead: "add " + strings.Join(missing, ", ") + " (see meshnode module show --builtin)"})
		}
	}
}
