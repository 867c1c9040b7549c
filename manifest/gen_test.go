package manifest_test

import (
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/meshnode/meshnode/manifest"
)

// validManifest is a random manifest that passes Validate, for testing/quick.
type validManifest struct{ *manifest.Manifest }

// Generate implements quick.Generator.
func (validManifest) Generate(r *rand.Rand, size int) reflect.Value {
	g := generator{r: r, size: max(size, 3)}
	return reflect.ValueOf(validManifest{g.manifest(fmt.Sprintf("mod%d", r.Intn(1000)))})
}

// generator makes random valid manifests. Names come from small pools so that patterns,
// emitters and seats meet each other often.
type generator struct {
	r    *rand.Rand
	size int
}

var (
	words   = []string{"order", "cart", "invoice", "image", "download", "user", "job", "a", "b", "x-1", "2fa"}
	modules = []string{"billing", "shop", "git", "builder", "registry", "mailer", "telegram", "n0", "a-b"}
	seats   = []string{"mailer", "sender", "build-machine", "worker", "index", "s1"}
)

func (g *generator) pick(pool []string) string { return pool[g.r.Intn(len(pool))] }

func (g *generator) n() int { return g.r.Intn(g.size) }

// names returns up to n distinct names built by f.
func (g *generator) names(n int, f func() string) []string {
	var out []string
	for range n {
		if s := f(); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func (g *generator) event() string {
	parts := make([]string, 1+g.r.Intn(3))
	for i := range parts {
		parts[i] = g.pick(words)
	}
	return strings.Join(parts, ".")
}

func (g *generator) pattern() string {
	if g.r.Intn(20) == 0 {
		return "**"
	}
	emitter := g.pick(modules)
	if g.r.Intn(4) == 0 {
		emitter = "*"
	}
	parts := []string{emitter}
	for i := range 1 + g.r.Intn(3) {
		switch g.r.Intn(5) {
		case 0:
			parts = append(parts, "*")
		case 1:
			if i == 0 {
				parts = append(parts, "**")
				return strings.Join(parts, ".")
			}
			fallthrough
		default:
			parts = append(parts, g.pick(words))
		}
	}
	if g.r.Intn(6) == 0 {
		parts = append(parts, "**")
	}
	return strings.Join(parts, ".")
}

func (g *generator) seat(name string) manifest.Seat {
	s := manifest.Seat{
		Name:    name,
		Scope:   manifest.ScopeMesh,
		Accepts: g.names(g.n(), func() string { return g.pick(words) }),
		Emits:   g.names(g.n(), g.event),
		Serves:  g.names(g.n(), func() string { return g.pick(words) }),
	}
	if g.r.Intn(2) == 0 {
		s.Scope = manifest.ScopeNode
	}
	if len(s.Accepts) > 0 || g.r.Intn(2) == 0 {
		s.Retain = []string{"7d", "12h", "30m", "1d12h", "90s"}[g.r.Intn(5)]
	}
	return s
}

// manifest returns a valid manifest of module. Consumes naming the module itself are left
// out: whether they pass depends on its emits, which Validate checks and tests elsewhere.
func (g *generator) manifest(module string) *manifest.Manifest {
	m := &manifest.Manifest{
		Module:   module,
		Requires: []string{"mesh-bus"},
		Emits:    g.names(g.n(), g.event),
		Consumes: g.names(g.n(), g.pattern),
		Tools:    g.names(g.n(), func() string { return g.pick(words) }),
		Uses:     g.names(g.n(), func() string { return g.pick(seats) }),
		Secrets:  g.names(g.n(), func() string { return g.pick(words) + "-key" }),
	}
	if g.r.Intn(5) == 0 {
		m.Requires = append(m.Requires, "postgres")
	}
	m.Consumes = slices.DeleteFunc(m.Consumes, func(p string) bool { return strings.HasPrefix(p, module+".") })
	for i, name := range g.names(g.r.Intn(3), func() string { return g.pick(seats) }) {
		m.Seats = append(m.Seats, g.seat(fmt.Sprintf("%s-%d", name, i)))
	}
	if err := m.Validate(); err != nil {
		panic(fmt.Sprintf("the generator made an invalid manifest: %v\n%+v", err, m))
	}
	return m
}

// catalogue returns n valid manifests with distinct module and seat names.
func (g *generator) catalogue(n int) []*manifest.Manifest {
	ms := make([]*manifest.Manifest, n)
	for i := range ms {
		ms[i] = g.manifest(fmt.Sprintf("module-%d", i))
		for j := range ms[i].Seats {
			ms[i].Seats[j].Name = fmt.Sprintf("%s-m%d", ms[i].Seats[j].Name, i)
		}
	}
	return ms
}

// marshal writes m as manifest YAML.
func marshal(m *manifest.Manifest) []byte {
	type seat struct {
		Scope   string   `yaml:"scope"`
		Retain  string   `yaml:"retain,omitempty"`
		Accepts []string `yaml:"accepts,omitempty,flow"`
		Emits   []string `yaml:"emits,omitempty,flow"`
		Serves  []string `yaml:"serves,omitempty,flow"`
	}
	doc := struct {
		Module   string          `yaml:"module"`
		Requires []string        `yaml:"requires,omitempty,flow"`
		Emits    []string        `yaml:"emits,omitempty,flow"`
		Consumes []string        `yaml:"consumes,omitempty,flow"`
		Tools    []string        `yaml:"tools,omitempty,flow"`
		Uses     []string        `yaml:"uses,omitempty,flow"`
		Secrets  []string        `yaml:"secrets,omitempty,flow"`
		Seats    map[string]seat `yaml:"seats,omitempty"`
	}{m.Module, m.Requires, m.Emits, m.Consumes, m.Tools, m.Uses, m.Secrets, map[string]seat{}}
	for _, s := range m.Seats {
		doc.Seats[s.Name] = seat{string(s.Scope), s.Retain, s.Accepts, s.Emits, s.Serves}
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return data
}
