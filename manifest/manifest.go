package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// RequireBus is the requirement that gives a module a bus account: a module that does not
// require it may not speak on the mesh, and has no account at all.
const RequireBus = "mesh-bus"

// Scope says how many holders a seat has.
type Scope string

// The scopes of a seat.
const (
	// ScopeMesh seats have one holder in the whole mesh.
	ScopeMesh Scope = "mesh"
	// ScopeNode seats have one holder per node, each with its own work queue.
	ScopeNode Scope = "node"
)

// Manifest is a module's declaration: its name, what it requires, and the relationships
// from which the mesh derives every subject, stream, consumer and permission. A manifest
// never holds a subject. The zero value is not valid; build one with Parse or by hand and
// check it with Validate.
type Manifest struct {
	// Module is the module's name: one name part, unique in the mesh.
	Module string `json:"module"`
	// Requires lists the interfaces the module needs delivered: RequireBus to speak on the
	// mesh, and provisions such as postgres.
	Requires []string `json:"requires,omitempty"`
	// Options are what a required interface is asked for, by interface (YAML: the
	// requirement written as a one-key mapping, `- postgres: {connection-limit: "5"}`): the
	// provider's create receives them, and a change of them creates the resource again.
	Options map[string]map[string]string `json:"options,omitempty"`
	// Emits lists the events the module publishes under its own name, e.g. order.placed.
	Emits []string `json:"emits,omitempty"`
	// Consumes lists the events the module reacts to, as <emitter>.<event> patterns: * is
	// one name, ** the rest, and ** alone every event in the mesh.
	Consumes []string `json:"consumes,omitempty"`
	// Tools lists the request/reply calls the module answers.
	Tools []string `json:"tools,omitempty"`
	// Uses lists the seats the module sends work to.
	Uses []string `json:"uses,omitempty"`
	// Secrets lists the names of the secrets the module may fetch; never their values.
	Secrets []string `json:"secrets,omitempty"`
	// BuildFrom is where the module is built from (YAML build.from): <repository>/<path>, a
	// repository name the mesh-git holder knows (never a host or URL) and a path in it.
	BuildFrom string `json:"build_from,omitempty"`
	// BuildRun is the command (YAML build.run) run by `sh -c` in that path of a checkout;
	// it writes the artifact to the file $OUT.
	BuildRun string `json:"build_run,omitempty"`
	// BuildOn lists the modules whose artifact this module's is built on (YAML build.on).
	BuildOn []string `json:"build_on,omitempty"`
	// Seats lists the seats the module declares, in name order when parsed.
	Seats []Seat `json:"seats,omitempty"`
	// Limits bound what one instance of the module may use on its node (DESIGN §13); a
	// zero field is the node's default.
	Limits Limits `json:"limits,omitzero"`

	// src is the YAML the manifest was parsed from, nil when built by hand. Validate reads
	// it only to put line numbers on refusals.
	src []byte
}

// Limits bound one instance of a module on its node: memory (memory.max), processes
// (pids.max), CPU weight (cpu.weight, 100 the default share) and what its work directory
// may hold. Zero is the node's default (module-memory, module-processes, module-disk).
type Limits struct {
	Memory    Size `json:"memory,omitempty"`
	Processes int  `json:"processes,omitempty"`
	CPUWeight int  `json:"cpu_weight,omitempty"`
	Disk      Size `json:"disk,omitempty"`
}

// Seat is a role a module declares, with the protocol the role carries. Exactly one
// instance holds it per scope.
type Seat struct {
	// Name is the seat's name: one name part; the mesh- prefix is the mesh's own.
	Name string `json:"name"`
	// Scope is ScopeMesh or ScopeNode.
	Scope Scope `json:"scope"`
	// Retain is how long the seat's inbound backlog survives, as written: 7d, 12h, 30m.
	// Required when the seat accepts anything; see ParseRetain.
	Retain string `json:"retain,omitempty"`
	// Backlog is the most its inbound backlog holds, as written: 64MiB, 1GiB; see
	// ParseBacklog. Empty: the node's default (seat-max-bytes). The node reserves it in its
	// store when it makes the seat's work queue, so it is what the seat costs.
	Backlog string `json:"backlog,omitempty"`
	// Accepts lists the verbs of work the seat takes from its work queue.
	Accepts []string `json:"accepts,omitempty"`
	// Emits lists the events the seat's holder publishes under the seat's name.
	Emits []string `json:"emits,omitempty"`
	// Serves lists the request/reply calls the seat's holder answers.
	Serves []string `json:"serves,omitempty"`
	// Shapes are the JSON shapes of the payloads of its verbs, tools and events, by name;
	// a name without a shape carries any JSON.
	Shapes map[string]*Shape `json:"shapes,omitempty"`
	// Provides lists the interfaces the seat's holder provisions for other modules (DESIGN
	// §12: a module that requires one gets a resource and its credential from it); its
	// protocol then serves create, remove and holds.
	Provides []string `json:"provides,omitempty"`
	// Versions are the seat's later protocol versions (v2 … v9), served beside the first
	// (v1: the fields above) by the same holder, on mesh.seat.<seat>.<version>.…: a breaking
	// change is made as a new version, and callers move to it by re-pinning. Sorted by name.
	Versions []SeatVersion `json:"versions,omitempty"`
}

// SeatVersion is one later version of a seat's protocol; scope and retain are the seat's.
type SeatVersion struct {
	// Name is the version: v2 … v9.
	Name    string            `json:"name"`
	Accepts []string          `json:"accepts,omitempty"`
	Emits   []string          `json:"emits,omitempty"`
	Serves  []string          `json:"serves,omitempty"`
	Shapes  map[string]*Shape `json:"shapes,omitempty"`
}

// Seat returns the seat m declares under name.
func (m *Manifest) Seat(name string) (Seat, bool) {
	for _, s := range m.Seats {
		if s.Name == name {
			return s, true
		}
	}
	return Seat{}, false
}

// Built reports whether m is built by the mesh (it declares build.from).
func (m *Manifest) Built() bool { return m.BuildFrom != "" }

// BuildSource splits build.from into its repository and its path ("." for the repository's
// root).
func (m *Manifest) BuildSource() (repository, path string) {
	repository, path, _ = strings.Cut(m.BuildFrom, "/")
	if path == "" {
		path = "."
	}
	return repository, path
}

// requiresBus reports whether m requires the mesh's bus.
func (m *Manifest) requiresBus() bool { return slices.Contains(m.Requires, RequireBus) }

// rawManifest is the YAML shape of a manifest, decoded strictly (unknown keys refused).
// Seats are a mapping keyed by name in YAML and a list in Manifest; hence the two types.
type rawManifest struct {
	Module   string             `yaml:"module"`
	Requires []rawRequirement   `yaml:"requires"`
	Emits    []string           `yaml:"emits"`
	Consumes []string           `yaml:"consumes"`
	Tools    []string           `yaml:"tools"`
	Uses     []string           `yaml:"uses"`
	Secrets  []string           `yaml:"secrets"`
	Build    *rawBuild          `yaml:"build"`
	Seats    map[string]rawSeat `yaml:"seats"`
	Limits   *rawLimits         `yaml:"limits"`
}

type rawLimits struct {
	Memory    Size `yaml:"memory"`
	Processes int  `yaml:"processes"`
	CPUWeight int  `yaml:"cpu-weight"`
	Disk      Size `yaml:"disk"`
}

// rawRequirement is one item of requires: an interface's name, or a one-key mapping from the
// name to its options (text values).
type rawRequirement struct {
	Interface string
	Options   map[string]string
}

func (r *rawRequirement) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		return n.Decode(&r.Interface)
	}
	var m map[string]map[string]string
	err := errors.New("not one interface")
	if n.Kind == yaml.MappingNode && len(n.Content) == 2 {
		if opts := n.Content[1]; opts.Kind == yaml.MappingNode {
			// A duplicate option is the duplicate-key refusal (yaml.v3's own words), naming it.
			seen := map[string]int{}
			for i := 0; i+1 < len(opts.Content); i += 2 {
				k := opts.Content[i]
				if line, dup := seen[k.Value]; dup {
					return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: mapping key %q already defined at line %d", k.Line, k.Value, line)}}
				}
				seen[k.Value] = k.Line
			}
		}
		err = n.Decode(&m)
	}
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: a requirement is an interface's name, or one name with a mapping of its options", n.Line)}}
	}
	for iface, opts := range m {
		r.Interface, r.Options = iface, opts
		if r.Options == nil {
			r.Options = map[string]string{}
		}
	}
	return nil
}

type rawBuild struct {
	From string   `yaml:"from"`
	Run  string   `yaml:"run"`
	On   []string `yaml:"on"`
}

type rawSeat struct {
	Scope    string                `yaml:"scope"`
	Retain   string                `yaml:"retain"`
	Backlog  string                `yaml:"backlog"`
	Accepts  []string              `yaml:"accepts"`
	Emits    []string              `yaml:"emits"`
	Serves   []string              `yaml:"serves"`
	Shapes   map[string]*Shape     `yaml:"shapes"`
	Provides []string              `yaml:"provides"`
	Versions map[string]rawVersion `yaml:"versions"`
}

type rawVersion struct {
	Accepts []string          `yaml:"accepts"`
	Emits   []string          `yaml:"emits"`
	Serves  []string          `yaml:"serves"`
	Shapes  map[string]*Shape `yaml:"shapes"`
}

// The keys each level of a manifest knows, in the order a manifest writes them; an
// unknown-key refusal lists them.
var (
	manifestKeys = []string{"module", "requires", "emits", "consumes", "tools", "uses", "secrets", "build", "seats", "limits"}
	limitsKeys   = []string{"memory", "processes", "cpu-weight", "disk"}
	seatKeys     = []string{"scope", "retain", "backlog", "accepts", "emits", "serves", "shapes", "provides", "versions"}
	versionKeys  = []string{"accepts", "emits", "serves", "shapes"}
	buildKeys    = []string{"from", "run", "on"}
)

// Parse decodes one manifest from YAML, strictly: an unknown key, a duplicate key, a value
// of the wrong shape or a second document is refused. The error is a Refusals naming every
// problem with its line. Parse does not validate names; call Validate, or Check for every
// check at once.
func Parse(data []byte) (*Manifest, error) {
	m, rs := parse(data)
	if len(rs) > 0 {
		return nil, rs
	}
	return m, nil
}

// parse is Parse that keeps going where it can: when the only problems are unknown keys it
// also returns the manifest decoded from the keys it knows, so Check can report the rest of
// the manifest's refusals in the same pass. On any other problem the manifest is nil.
func parse(data []byte) (*Manifest, Refusals) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var raw rawManifest
	var rs Refusals
	if err := dec.Decode(&raw); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, Refusals{{Code: CodeYAML, Reason: "the manifest is empty", Instead: "write at least module: <name>"}}
		}
		rs = decodeRefusals(err, data)
		if slices.ContainsFunc(rs, func(r Refusal) bool { return r.Code != CodeUnknownKey }) {
			return nil, rs
		}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, append(rs, Refusal{
			Code:    CodeYAML,
			Line:    extra.Line,
			Reason:  "the file holds more than one YAML document",
			Instead: "write one manifest per file",
		})
	}

	m := &Manifest{
		Module:   raw.Module,
		Emits:    raw.Emits,
		Consumes: raw.Consumes,
		Tools:    raw.Tools,
		Uses:     raw.Uses,
		Secrets:  raw.Secrets,
		src:      data,
	}
	for _, r := range raw.Requires {
		m.Requires = append(m.Requires, r.Interface)
		if r.Options != nil {
			if m.Options == nil {
				m.Options = map[string]map[string]string{}
			}
			m.Options[r.Interface] = r.Options
		}
	}
	if raw.Build != nil {
		m.BuildFrom, m.BuildRun, m.BuildOn = raw.Build.From, raw.Build.Run, raw.Build.On
	}
	if raw.Limits != nil {
		m.Limits = Limits{Memory: raw.Limits.Memory, Processes: raw.Limits.Processes, CPUWeight: raw.Limits.CPUWeight, Disk: raw.Limits.Disk}
	}
	for name, s := range raw.Seats {
		for _, sh := range s.Shapes {
			sh.normalise()
		}
		seat := Seat{
			Name:    name,
			Scope:   Scope(s.Scope),
			Retain:  s.Retain,
			Backlog: s.Backlog,
			Accepts: s.Accepts,
			Emits:   s.Emits,
			Serves:  s.Serves,
			Shapes:  s.Shapes,
		}
		seat.Provides = s.Provides
		for vname, v := range s.Versions {
			for _, sh := range v.Shapes {
				sh.normalise()
			}
			seat.Versions = append(seat.Versions, SeatVersion{Name: vname, Accepts: v.Accepts, Emits: v.Emits, Serves: v.Serves, Shapes: v.Shapes})
		}
		slices.SortFunc(seat.Versions, func(a, b SeatVersion) int { return compareVersions(a.Name, b.Name) })
		m.Seats = append(m.Seats, seat)
	}
	slices.SortFunc(m.Seats, func(a, b Seat) int { return strings.Compare(a.Name, b.Name) })
	return m, rs
}
