package manifest

import (
	"errors"
	"fmt"
	"maps"
	pathpkg "path"
	"slices"
	"strconv"
	"strings"
)

// Code classifies a refusal, for tests and for tools that read refusals as data.
type Code string

// The refusal codes. The numbers are the rules of issue 3.
const (
	CodeSubject      Code = "subject"       // 1: a value in a wire's grammar
	CodeNoBus        Code = "no-bus"        // 2: relationships declared without requires: [mesh-bus]
	CodeWildcardEmit Code = "wildcard-emit" // 3: an emitted event with a wildcard
	CodeReserved     Code = "reserved"      // 4: a mesh-* seat, or a module name the mesh keeps
	CodeName         Code = "name"          // 5: a name outside the grammar, empty or too long
	CodeUnknownKey   Code = "unknown-key"   // 5: a key the manifest does not know
	CodeDuplicate    Code = "duplicate"     // 5: the same entry twice
	CodeScope        Code = "scope"         // 5: a seat's scope missing or not mesh|node
	CodeRetain       Code = "retain"        // 5: a seat's retain missing or not a positive duration
	CodeShape        Code = "shape"         // 5: a value of the wrong YAML shape
	CodeYAML         Code = "yaml"          // 5: not YAML, or not one document
	CodeSeatTaken    Code = "seat-taken"    // 6: a seat another module declares
	CodeNotEmitted   Code = "not-emitted"   // 6: a consumed event its present emitter (itself included) does not emit
	CodeBreaking     Code = "breaking"      // 6: a seat protocol change that breaks its users
	CodeModuleTwice  Code = "module-twice"  // 6: two manifests for one module in one check
	CodeSize         Code = "size"          // issue 11: a manifest over MaxSize
	CodePayloadShape Code = "payload-shape" // issue 14: a seat's shape that names nothing or is malformed
	CodeBuild        Code = "build"         // issue 16: build.from, build.run or build.on that cannot be built
	CodeBuildCycle   Code = "build-cycle"   // issue 16: build.on closing a cycle across the catalogue
	CodeProvider     Code = "provider"      // issue 17: a seat that provides an interface without the provisioner tools
	CodeLimits       Code = "limits"        // issue 33: a limit outside what a module can run within
	CodeBacklog      Code = "backlog"       // issue 37: a seat's backlog not a size it can reserve, or on a seat with no queue
)

// Refusal is one reason a manifest cannot be registered, and what to write instead.
type Refusal struct {
	// Code classifies the refusal.
	Code Code `json:"code"`
	// Field is the path of the refused value: "consumes[1]", "seats.sender.retain",
	// "build.on[0]"; "" for the file as a whole.
	Field string `json:"field,omitempty"`
	// Value is the refused value as written; "" when the value is missing.
	Value string `json:"value,omitempty"`
	// Reason says what is wrong, as a clause that follows the value.
	Reason string `json:"reason"`
	// Instead says what to write instead, as an imperative: "write billing.order.placed".
	Instead string `json:"instead"`
	// Line is the 1-based line of Field in the YAML the manifest was parsed from; 0 when the
	// manifest was built by hand or the field is missing from the file.
	Line int `json:"line,omitempty"`
}

// Error formats r as `field "value": reason; instead`, without the line.
func (r Refusal) Error() string {
	var b strings.Builder
	b.WriteString(r.Field)
	if r.Value != "" {
		if r.Field != "" {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Quote(r.Value))
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	b.WriteString(r.Reason)
	if r.Instead != "" {
		b.WriteString("; ")
		b.WriteString(r.Instead)
	}
	return b.String()
}

// Refusals is every refusal of one manifest, in the order of the file. It is the error
// Parse, Validate and CheckCatalogue return; a nil Refusals is never returned as an error.
type Refusals []Refusal

// Error formats every refusal, one per line.
func (rs Refusals) Error() string {
	lines := make([]string, len(rs))
	for i, r := range rs {
		lines[i] = r.Error()
	}
	return strings.Join(lines, "\n")
}

// reservedModules are module names the mesh keeps: the first parts of the old bus's routing
// keys (a consumer could never name their events), the mesh's own namespace, and the names
// of the identities that administer it (the vault and the controller tell callers apart by
// name).
var reservedModules = []string{"mesh", "module", "node", "operator", "admin", "vault", "controller", SeatEventsPrefix}

// reservedModulePrefix marks module names that would collide with the mesh's per-node
// audit-<node> consumers on EVENTS, which share the namespace of module consumer names.
const reservedModulePrefix = "audit-"

// reservedSeatPrefix marks the mesh's own seats (mesh-controller, mesh-vault, ...).
const reservedSeatPrefix = "mesh-"

// Validate checks m against every per-manifest rule and returns all refusals as Refusals,
// or nil. It checks nothing against other manifests; see CheckCatalogue.
func (m *Manifest) Validate() error {
	v := &validator{m: m}
	v.validate()
	return v.result()
}

// validator collects the refusals of one manifest.
type validator struct {
	m       *Manifest
	rs      Refusals
	builtin bool // the built-in manifest: the mesh's own module and seats
	// bound: the caller checks protocol changes against the registry's bindings
	// (CheckBindings), which know each user's pinned version; the catalogue checks only
	// that a used seat is not removed.
	bound bool
}

func (v *validator) refuse(r Refusal) { v.rs = append(v.rs, r) }

// result returns the refusals, with lines when the manifest was parsed, in file order.
func (v *validator) result() error {
	if len(v.rs) == 0 {
		return nil
	}
	if v.m.src != nil {
		idx := indexLines(v.m.src)
		for i := range v.rs {
			if v.rs[i].Line == 0 {
				v.rs[i].Line = idx.line(v.rs[i].Field)
			}
		}
		// File order by top-level key (by seat, within seats), and the order of the checks
		// within one: a missing key has no line of its own, and a seat's missing scope reads
		// best before its missing retain.
		top := func(r Refusal) int {
			parts := strings.SplitN(r.Field, ".", 3)
			key, _, _ := strings.Cut(parts[0], "[")
			if key == "seats" && len(parts) > 1 {
				name, _, _ := strings.Cut(parts[1], "[")
				key += "." + name
			}
			return idx.line(key)
		}
		slices.SortStableFunc(v.rs, func(a, b Refusal) int { return top(a) - top(b) })
	}
	return v.rs
}

func (v *validator) validate() {
	m := v.m
	var rs Refusals
	if errors.As(CheckSize(len(m.src)), &rs) {
		v.rs = append(v.rs, rs...)
	}
	v.module()
	v.list("requires", m.Requires, kindRequire)
	v.options()
	v.list("emits", m.Emits, kindEmit)
	v.list("consumes", m.Consumes, kindConsume)
	v.list("tools", m.Tools, kindTool)
	v.list("uses", m.Uses, kindUses)
	v.list("secrets", m.Secrets, kindSecret)
	for i, name := range m.Secrets {
		if strings.HasPrefix(name, reservedSeatPrefix) {
			v.refuse(Refusal{Code: CodeReserved, Field: fmt.Sprintf("secrets[%d]", i), Value: name,
				Reason: "mesh-* names are the vault's own (it keeps the module's seed as mesh-seed)", Instead: "choose another name, e.g. " + strings.TrimPrefix(name, reservedSeatPrefix)})
		}
	}
	v.selfProvided()
	v.build()
	v.list("build.on", m.BuildOn, kindBuildOn)
	for i, on := range m.BuildOn {
		if on == m.Module && m.Module != "" {
			v.refuse(Refusal{Code: CodeName, Field: fmt.Sprintf("build.on[%d]", i), Value: on,
				Reason: "a module cannot be built on itself", Instead: "remove it"})
		}
	}
	seen := map[string]int{}
	for i, s := range m.Seats {
		if j, ok := seen[s.Name]; ok {
			v.refuse(Refusal{Code: CodeDuplicate, Field: "seats." + s.Name, Value: s.Name,
				Reason: fmt.Sprintf("is declared twice (seats %d and %d)", j, i), Instead: "merge the two into one seat"})
			continue
		}
		seen[s.Name] = i
		v.seat(s)
	}
	v.consumes()
	v.bus()
	v.limits()
}

// The bounds of a manifest's limits: below them no runtime starts; above them a limit means
// nothing (cpu.weight's own range).
const (
	MinMemoryLimit    = 8 << 20
	MinProcessesLimit = 4
	MinDiskLimit      = 1 << 20
	MaxCPUWeight      = 10000
)

// limits checks the limits: each zero (the node's default) or within what a process can
// run with.
func (v *validator) limits() {
	l := v.m.Limits
	refuse := func(field string, value any, reason, instead string) {
		v.refuse(Refusal{Code: CodeLimits, Field: "limits." + field, Value: fmt.Sprint(value), Reason: reason, Instead: instead})
	}
	if l.Memory != 0 && l.Memory < MinMemoryLimit {
		refuse("memory", l.Memory, "is below 8MiB, which no runtime starts in", "write at least 8MiB, e.g. 256MiB, or leave it out for the node's default")
	}
	if l.Processes < 0 || (l.Processes > 0 && l.Processes < MinProcessesLimit) {
		refuse("processes", l.Processes, "is below 4: a shell and the program it runs need more", "write at least 4, e.g. 64, or leave it out for the node's default")
	}
	if l.CPUWeight < 0 || l.CPUWeight > MaxCPUWeight {
		refuse("cpu-weight", l.CPUWeight, "is a share from 1 to 10000 (100 is every module's default)", "write e.g. 200 for twice the default share")
	}
	if l.Disk != 0 && l.Disk < MinDiskLimit {
		refuse("disk", l.Disk, "is below 1MiB", "write at least 1MiB, e.g. 1GiB, or leave it out for the node's default")
	}
}

// build checks build.from and build.run: both or neither, a repository name and a clean
// relative path, and a command; build.on needs them (only a built module is rebuilt).
func (v *validator) build() {
	m := v.m
	switch {
	case m.BuildFrom == "" && m.BuildRun == "" && len(m.BuildOn) > 0:
		v.refuse(Refusal{Code: CodeBuild, Field: "build.on", Reason: "a module built on others must say how it is built",
			Instead: "write build: {from: <repository>/<path>, run: <command>, on: [...]}"})
	case m.BuildFrom == "" && m.BuildRun != "":
		v.refuse(Refusal{Code: CodeBuild, Field: "build.from", Reason: "is missing; run needs a source to run in",
			Instead: "write from: <repository>/<path>, e.g. from: shop/services/cart"})
	case m.BuildFrom != "" && strings.TrimSpace(m.BuildRun) == "":
		v.refuse(Refusal{Code: CodeBuild, Field: "build.run", Reason: "is missing; the builder runs it and it writes the artifact to $OUT",
			Instead: "write run: go build -o \"$OUT\" ."})
	}
	if m.BuildFrom == "" {
		return
	}
	repo, path := m.BuildSource()
	if !ValidName(repo) {
		reason := "must begin with a repository name the mesh-git holder knows (lower-case letters, digits and '-'), never a host or URL"
		v.refuse(Refusal{Code: CodeBuild, Field: "build.from", Value: m.BuildFrom, Reason: reason,
			Instead: "write <repository>/<path>, e.g. shop/services/cart"})
		return
	}
	if clean := pathpkg.Clean(path); clean != path || strings.HasPrefix(path, "/") || path == ".." || strings.HasPrefix(path, "../") || strings.ContainsAny(path, "\\\x00") {
		v.refuse(Refusal{Code: CodeBuild, Field: "build.from", Value: m.BuildFrom,
			Reason: "its path must be a clean path inside the repository", Instead: "write " + repo + "/" + strings.TrimPrefix(pathpkg.Clean("/"+path), "/")})
	}
}

func (v *validator) module() {
	name := v.m.Module
	switch {
	case name == "":
		v.refuse(Refusal{Code: CodeName, Field: "module", Reason: "is missing", Instead: "write module: <name>, e.g. module: billing"})
	case !v.value("module", name, kindModule):
	case v.builtin && name == BuiltinModule:
	case slices.Contains(reservedModules, name):
		v.refuse(Refusal{Code: CodeReserved, Field: "module", Value: name,
			Reason: "is a name the mesh keeps for its own subjects and patterns", Instead: "choose another name, e.g. " + name + "-app"})
	case strings.HasPrefix(name, reservedModulePrefix):
		v.refuse(Refusal{Code: CodeReserved, Field: "module", Value: name,
			Reason: "begins with audit-, the prefix of the mesh's per-node audit consumers", Instead: "choose another name, e.g. " + strings.TrimPrefix(name, reservedModulePrefix) + "-audit"})
	}
}

// list checks every value of a list field and refuses duplicates.
func (v *validator) list(field string, vals []string, k fieldKind) {
	first := map[string]int{}
	for i, s := range vals {
		f := fmt.Sprintf("%s[%d]", field, i)
		if j, ok := first[s]; ok {
			v.refuse(Refusal{Code: CodeDuplicate, Field: f, Value: s,
				Reason: fmt.Sprintf("duplicates %s[%d]", field, j), Instead: "remove it"})
			continue
		}
		first[s] = i
		v.value(f, s, k)
	}
}

// value checks one value against rules 1, 3 and 5 and reports whether it passed.
func (v *validator) value(field, s string, k fieldKind) bool {
	if s == "" {
		v.refuse(Refusal{Code: CodeName, Field: field, Reason: "is empty", Instead: "write " + k.noun() + " or remove the entry"})
		return false
	}
	if reason, instead, ok := wireSpelling(s, k); ok {
		v.refuse(Refusal{Code: CodeSubject, Field: field, Value: s, Reason: reason, Instead: instead})
		return false
	}
	if k == kindConsume {
		if _, err := ConsumeSubject(s); err != nil {
			pe := err.(*patternError)
			v.refuse(Refusal{Code: CodeName, Field: field, Value: s, Reason: pe.reason, Instead: pe.instead})
			return false
		}
		return true
	}
	if hasWildcard(s) {
		if k == kindEmit || k == kindSeatEmit {
			v.refuse(Refusal{Code: CodeWildcardEmit, Field: field, Value: s,
				Reason: "holds a wildcard; an emit names one event", Instead: "write one event's name, e.g. order.placed; wildcards belong in consumes"})
		} else {
			v.refuse(Refusal{Code: CodeName, Field: field, Value: s,
				Reason: "holds a wildcard; " + k.noun() + " names one thing", Instead: "write one name; wildcards belong in consumes"})
		}
		return false
	}
	if (k.dotted() && !validDotted(s)) || (!k.dotted() && !ValidName(s)) {
		reason, fixed := nameProblem(s, k.dotted())
		instead := "use lower-case letters, digits and '-'"
		if k.dotted() {
			instead += " in each dot-separated part"
		}
		if fixed != "" && fixed != s {
			instead = "write " + fixed
		}
		v.refuse(Refusal{Code: CodeName, Field: field, Value: s, Reason: reason, Instead: instead})
		return false
	}
	return true
}

func hasWildcard(s string) bool { return strings.ContainsAny(s, "*#>") }

func (v *validator) seat(s Seat) {
	field := "seats." + s.Name
	if v.value(field, s.Name, kindSeat) && strings.HasPrefix(s.Name, reservedSeatPrefix) && !v.builtin {
		v.meshSeat(field, s)
	}
	switch s.Scope {
	case ScopeMesh, ScopeNode:
	case "":
		v.refuse(Refusal{Code: CodeScope, Field: field + ".scope", Reason: "is missing",
			Instead: "write scope: mesh (one holder in the mesh) or scope: node (one holder per node)"})
	default:
		v.refuse(Refusal{Code: CodeScope, Field: field + ".scope", Value: string(s.Scope),
			Reason: "is neither mesh nor node", Instead: "write scope: mesh (one holder in the mesh) or scope: node (one holder per node)"})
	}
	switch {
	case s.Retain == "" && s.AcceptsWork():
		v.refuse(Refusal{Code: CodeRetain, Field: field + ".retain", Reason: "is missing; a seat that accepts work says how long its backlog survives",
			Instead: "write retain: 7d (units d, h, m, s)"})
	case s.Retain != "":
		if _, err := ParseRetain(s.Retain); err != nil {
			v.refuse(Refusal{Code: CodeRetain, Field: field + ".retain", Value: s.Retain,
				Reason: "is not a duration from 100ms (the least JetStream keeps a backlog) to 36500d", Instead: "write e.g. retain: 7d, 12h or 30m (d = 24h)"})
		}
	}
	v.backlog(field, s)
	v.protocol(field, s.Accepts, s.Emits, s.Serves, s.Shapes)
	v.provides(field, s)
	for _, ver := range s.Versions {
		f := field + ".versions." + ver.Name
		switch {
		case !validVersion(ver.Name):
			v.refuse(Refusal{Code: CodeName, Field: f, Value: ver.Name,
				Reason:  fmt.Sprintf("is not a version a seat can declare; v1 is the seat's own fields, later ones are v2 … v%d", MaxVersion),
				Instead: "name the next version after the highest one declared, e.g. v2"})
			continue
		case strings.HasPrefix(s.Name, reservedSeatPrefix):
			v.refuse(Refusal{Code: CodeReserved, Field: f, Value: ver.Name,
				Reason: "the mesh's own seats have one protocol version", Instead: "remove versions: from seat " + s.Name})
			continue
		}
		v.protocol(f, ver.Accepts, ver.Emits, ver.Serves, ver.Shapes)
	}
}

// backlog refuses a seat's backlog that is not a size from MinBacklog to MaxBacklog, or that
// is declared on a seat with no work queue to hold it.
func (v *validator) backlog(field string, s Seat) {
	switch {
	case s.Backlog == "":
	case !s.AcceptsWork():
		v.refuse(Refusal{Code: CodeBacklog, Field: field + ".backlog", Value: s.Backlog,
			Reason: "is declared on a seat that accepts no work, so it has no queue to hold a backlog", Instead: "remove backlog:, or declare accepts: [<verb>] and retain:"})
	default:
		if _, err := ParseBacklog(s.Backlog); err != nil {
			v.refuse(Refusal{Code: CodeBacklog, Field: field + ".backlog", Value: s.Backlog,
				Reason:  fmt.Sprintf("is not a size from %s (one job of the bus's largest) to %s", Size(MinBacklog), Size(MaxBacklog)),
				Instead: "write e.g. backlog: 64MiB (units KiB, MiB, GiB, TiB, KB, MB, GB, TB), or leave it out for the node's default"})
		}
	}
}

// The bounds of a requirement's options: a provider is asked for a resource, not sent data.
const (
	MaxOptions     = 16
	MaxOptionBytes = 256
)

// options checks the options of the requirements: each for an interface the module requires
// and some provider makes (not the mesh's own), named like any name, text within bounds.
func (v *validator) options() {
	for _, iface := range slices.Sorted(maps.Keys(v.m.Options)) {
		opts := v.m.Options[iface]
		field := "requires." + iface
		switch {
		case !slices.Contains(v.m.Requires, iface):
			v.refuse(Refusal{Code: CodeShape, Field: field, Value: iface, Reason: "has options but is not required",
				Instead: "add it to requires:, or drop its options"})
			continue
		case slices.Contains(MeshProvided, iface):
			v.refuse(Refusal{Code: CodeReserved, Field: field, Value: iface, Reason: "is the mesh's own and takes no options",
				Instead: "write - " + iface})
			continue
		case len(opts) > MaxOptions:
			v.refuse(Refusal{Code: CodeSize, Field: field, Value: strconv.Itoa(len(opts)) + " options",
				Reason: "more than " + strconv.Itoa(MaxOptions) + " options", Instead: "ask the provider for less"})
		}
		for _, key := range slices.Sorted(maps.Keys(opts)) {
			if !ValidName(key) {
				v.refuse(Refusal{Code: CodeName, Field: field + "." + key, Value: key,
					Reason: "an option is named like any name: lower-case letters, digits and -", Instead: "e.g. connection-limit"})
			}
			if len(opts[key]) > MaxOptionBytes {
				v.refuse(Refusal{Code: CodeSize, Field: field + "." + key, Value: strconv.Itoa(len(opts[key])) + " bytes",
					Reason: "an option's value is at most " + strconv.Itoa(MaxOptionBytes) + " bytes", Instead: "give the provider a name or a number, not data"})
			}
		}
	}
}

// ProvisionerTools are what a provisioner seat's protocol serves (DESIGN §12): create a
// consumer's resource, remove it, and say which it holds.
var ProvisionerTools = []string{"create", "remove", "holds"}

// RequireKV is the interface of a key-value bucket of the module's own, which the mesh
// provides (KVBucket names it; the module reaches it with its bus identity).
const RequireKV = "kv"

// MeshProvided are the interfaces the mesh provides itself; no seat may provide them.
var MeshProvided = []string{RequireBus, RequireKV}

// provides checks a seat's provided interfaces: names, not the mesh's own, and a protocol that
// serves every provisioner tool.
func (v *validator) provides(field string, s Seat) {
	if len(s.Provides) == 0 {
		return
	}
	v.list(field+".provides", s.Provides, kindProvide)
	for i, iface := range s.Provides {
		switch {
		case slices.Contains(MeshProvided, iface):
			v.refuse(Refusal{Code: CodeReserved, Field: fmt.Sprintf("%s.provides[%d]", field, i), Value: iface,
				Reason: "is provided by the mesh itself", Instead: "provide another interface, e.g. " + iface + "-external"})
		case iface == "mesh" || strings.HasPrefix(iface, "mesh-"):
			v.refuse(Refusal{Code: CodeReserved, Field: fmt.Sprintf("%s.provides[%d]", field, i), Value: iface,
				Reason:  "mesh-* names are the mesh's own (a consumer's variables would be MESH_*, which the host sets)",
				Instead: "name the interface after what it is, e.g. postgres"})
		}
	}
	if s.Scope != ScopeMesh {
		v.refuse(Refusal{Code: CodeProvider, Field: field + ".scope", Value: string(s.Scope),
			Reason:  "a seat that provides " + strings.Join(s.Provides, ", ") + " has one holder for the whole mesh: the controller asks it what it holds",
			Instead: "scope: mesh"})
	}
	var missing []string
	for _, t := range ProvisionerTools {
		if !slices.Contains(s.Serves, t) {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		v.refuse(Refusal{Code: CodeProvider, Field: field + ".serves", Value: strings.Join(s.Serves, ", "),
			Reason:  "a seat that provides " + strings.Join(s.Provides, ", ") + " is a provisioner, and lacks " + strings.Join(missing, ", "),
			Instead: "serve create, remove and holds: serves: [create, remove, holds]"})
	}
}

// selfProvided refuses a module that requires what one of its own seats provides: it would
// wait for a provision that only its own running instance can make.
func (v *validator) selfProvided() {
	for i, req := range v.m.Requires {
		for _, s := range v.m.Seats {
			if slices.Contains(s.Provides, req) {
				v.refuse(Refusal{Code: CodeProvider, Field: fmt.Sprintf("requires[%d]", i), Value: req,
					Reason:  "its own seat " + s.Name + " provides " + req + ": the module would wait for itself to start",
					Instead: "provide it from another module, or drop it from requires:"})
			}
		}
	}
}

// Waiting returns the interfaces m requires that neither the mesh nor a seat of the
// catalogue (or of m) provides: not an error — the module waits for a provider — but worth
// saying when it is checked.
func Waiting(m *Manifest, catalogue []*Manifest) []string {
	var out []string
	for _, req := range m.Requires {
		if slices.Contains(MeshProvided, req) || len(Providers(req, append([]*Manifest{m}, catalogue...))) > 0 {
			continue
		}
		out = append(out, req)
	}
	return out
}

// Providers returns the seats of the catalogue that provide iface, sorted.
func Providers(iface string, catalogue []*Manifest) []string {
	var out []string
	for _, o := range catalogue {
		if o == nil {
			continue
		}
		for _, s := range o.Seats {
			if slices.Contains(s.Provides, iface) && !slices.Contains(out, s.Name) {
				out = append(out, s.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// protocol checks one version of a seat's protocol: its names, and shapes only for them.
func (v *validator) protocol(field string, accepts, emits, serves []string, shapes map[string]*Shape) {
	v.list(field+".accepts", accepts, kindAccept)
	v.list(field+".emits", emits, kindSeatEmit)
	v.list(field+".serves", serves, kindServe)
	for _, name := range sortedKeys(shapes) {
		f := field + ".shapes." + name
		if !slices.Contains(accepts, name) && !slices.Contains(serves, name) && !slices.Contains(emits, name) {
			v.refuse(Refusal{Code: CodePayloadShape, Field: f, Value: name,
				Reason:  "names no verb, tool or event of the seat",
				Instead: "give shapes only to names in accepts, serves or emits"})
			continue
		}
		for _, p := range shapes[name].problems(name) {
			v.refuse(Refusal{Code: CodePayloadShape, Field: f, Value: name, Reason: p,
				Instead: "write a JSON Schema subset: type, required, properties, items, enum"})
		}
	}
}

// consumes refuses events of the module's own that it consumes but does not emit. Patterns
// that overlap are fine: the consumer filters on those no other covers, and JetStream takes
// partially overlapping filters (it refuses only one filter inside another).
func (v *validator) consumes() {
	m := v.m
	subjects := make([]string, len(m.Consumes))
	for i, c := range m.Consumes {
		subjects[i], _ = ConsumeSubject(c)
	}
	if m.Module == "" {
		return
	}
	for i, c := range m.Consumes {
		if subjects[i] == "" || !strings.HasPrefix(c, m.Module+".") {
			continue
		}
		if emitted(subjects[i], m.Module, m.Emits) == nil {
			v.refuse(notEmitted(fmt.Sprintf("consumes[%d]", i), c, m.Module, m.Emits))
		}
	}
}

// emitted returns the events of emits, emitted by module, that pattern matches.
func emitted(pattern, module string, emits []string) []string {
	var out []string
	for _, e := range emits {
		if covers(pattern, EventSubject(module, e)) {
			out = append(out, e)
		}
	}
	return out
}

func notEmitted(field, pattern, emitter string, emits []string) Refusal {
	r := Refusal{Code: CodeNotEmitted, Field: field, Value: pattern}
	if len(emits) == 0 {
		r.Reason = emitter + " emits no events"
		r.Instead = "remove it, or add the event to " + emitter + "'s emits"
		return r
	}
	r.Reason = emitter + " does not emit it; it emits " + strings.Join(emits, ", ")
	keys := make([]string, len(emits))
	for i, e := range emits {
		keys[i] = emitter + "." + e
	}
	if len(keys) == 1 {
		r.Instead = "write " + keys[0]
	} else {
		r.Instead = "write one of " + strings.Join(keys, ", ")
	}
	return r
}

// bus refuses relationships declared without the bus they need (rule 2).
func (v *validator) bus() {
	m := v.m
	if m.requiresBus() {
		return
	}
	var declared []string
	for _, f := range []struct {
		name string
		n    int
	}{{"emits", len(m.Emits)}, {"consumes", len(m.Consumes)}, {"tools", len(m.Tools)}, {"uses", len(m.Uses)}, {"seats", len(m.Seats)}} {
		if f.n > 0 {
			declared = append(declared, f.name)
		}
	}
	if len(declared) == 0 {
		return
	}
	instead := "add it: write requires: [" + RequireBus + "]"
	if len(m.Requires) > 0 {
		instead = "add it: write requires: [" + strings.Join(append([]string{RequireBus}, m.Requires...), ", ") + "]"
	}
	v.refuse(Refusal{Code: CodeNoBus, Field: "requires", Value: strings.Join(m.Requires, ", "),
		Reason:  "does not hold " + RequireBus + ", yet the module declares " + strings.Join(declared, ", ") + ": speaking on the mesh without its bus is incoherent",
		Instead: instead})
}
