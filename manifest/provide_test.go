package manifest_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

const postgresProvisioner = `module: pg
requires: [mesh-bus]
seats:
  postgres:
    scope: mesh
    serves: [create, remove, holds]
    provides: [postgres]
`

// TestProvides: a seat that provides an interface serves the provisioner tools, and provides
// none of the mesh's own; a required interface with no provider is not refused, only said.
func TestProvides(t *testing.T) {
	pg := mustParse(t, postgresProvisioner)
	if s, _ := pg.Seat("postgres"); !slices.Equal(s.Provides, []string{"postgres"}) {
		t.Fatalf("provides %v", s.Provides)
	}
	for _, tc := range []struct{ name, yaml, field string }{
		{"without holds", strings.Replace(postgresProvisioner, "create, remove, holds", "create, remove", 1), "seats.postgres.serves"},
		{"the mesh's kv", strings.Replace(postgresProvisioner, "provides: [postgres]", "provides: [kv]", 1), "seats.postgres.provides[0]"},
		{"the mesh's bus", strings.Replace(postgresProvisioner, "provides: [postgres]", "provides: [mesh-bus]", 1), "seats.postgres.provides[0]"},
	} {
		m, err := manifest.Parse([]byte(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		rs := refusals(t, m.Validate())
		if !slices.ContainsFunc(rs, func(r manifest.Refusal) bool { return r.Field == tc.field }) {
			t.Errorf("%s: refusals %v, want one at %s", tc.name, rs, tc.field)
		}
	}
	app := mustParse(t, "module: app\nrequires: [mesh-bus, postgres, kv, redis]\n")
	if got := manifest.Waiting(app, []*manifest.Manifest{pg}); !slices.Equal(got, []string{"redis"}) {
		t.Fatalf("waiting %v, want redis alone (postgres has a provider, kv and mesh-bus are the mesh's)", got)
	}
	if got := manifest.Providers("postgres", []*manifest.Manifest{pg, app}); !slices.Equal(got, []string{"postgres"}) {
		t.Fatalf("providers %v", got)
	}
}

// TestProvides_ToolsAreTheControllers: no module may use a provisioner's seat (it could call
// create for any consumer), nor may a seat that modules use become a provisioner.
func TestProvides_ToolsAreTheControllers(t *testing.T) {
	pg := mustParse(t, postgresProvisioner)
	user := mustParse(t, "module: snoop\nrequires: [mesh-bus]\nuses: [postgres]\n")
	_, err := manifest.Check([]byte("module: snoop\nrequires: [mesh-bus]\nuses: [postgres]\n"), []*manifest.Manifest{pg})
	if rs := refusals(t, err); !slices.ContainsFunc(rs, func(r manifest.Refusal) bool {
		return r.Field == "uses[0]" && strings.Contains(r.Instead, "requires: [mesh-bus, postgres]")
	}) {
		t.Fatalf("using a provisioner's seat: %v", rs)
	}
	_, err = manifest.Check([]byte(postgresProvisioner), []*manifest.Manifest{user})
	if rs := refusals(t, err); !slices.ContainsFunc(rs, func(r manifest.Refusal) bool { return r.Field == "seats.postgres.provides" }) {
		t.Fatalf("a used seat becoming a provisioner: %v", rs)
	}
	if _, err := manifest.Check([]byte("module: app\nrequires: [mesh-bus, postgres]\n"), []*manifest.Manifest{pg}); err != nil {
		t.Fatalf("requiring what it provides: %v", err)
	}
}

// TestProvides_NotToItself: a module may not require what its own seat provides.
func TestProvides_NotToItself(t *testing.T) {
	m, err := manifest.Parse([]byte(strings.Replace(postgresProvisioner, "requires: [mesh-bus]", "requires: [mesh-bus, postgres]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if rs := refusals(t, m.Validate()); !slices.ContainsFunc(rs, func(r manifest.Refusal) bool { return r.Field == "requires[1]" }) {
		t.Fatalf("requiring its own seat's interface: %v", rs)
	}
}

// TestRequires_Options: a requirement may carry options, as a one-key mapping from the
// interface to text values; they are kept by interface. Options of the mesh's own
// interfaces, of an interface not required, bad option names, long values and a requirement
// of another shape are refused, each saying what to write.
func TestRequires_Options(t *testing.T) {
	m := mustParse(t, "module: app\nrequires:\n  - mesh-bus\n  - postgres: {connection-limit: 5, schema: app}\n  - redis\n")
	if !slices.Equal(m.Requires, []string{"mesh-bus", "postgres", "redis"}) {
		t.Fatalf("requires %v", m.Requires)
	}
	if got := m.Options["postgres"]; len(m.Options) != 1 || got["connection-limit"] != "5" || got["schema"] != "app" {
		t.Fatalf("options %v", m.Options)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	for _, tc := range []struct{ name, yaml, field, reason string }{
		{"the mesh's kv", "module: app\nrequires: [mesh-bus, {kv: {history: 5}}]\n", "requires.kv", "takes no options"},
		{"a bad option name", "module: app\nrequires: [mesh-bus, {postgres: {Limit: 5}}]\n", "requires.postgres.Limit", "named like any name"},
		{"a long value", "module: app\nrequires: [mesh-bus, {postgres: {schema: " + strings.Repeat("x", manifest.MaxOptionBytes+1) + "}}]\n", "requires.postgres.schema", "at most"},
	} {
		m, err := manifest.Parse([]byte(tc.yaml))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		rs := refusals(t, m.Validate())
		if !slices.ContainsFunc(rs, func(r manifest.Refusal) bool { return r.Field == tc.field && strings.Contains(r.Reason, tc.reason) }) {
			t.Errorf("%s: refusals %v, want one at %s saying %q", tc.name, rs, tc.field, tc.reason)
		}
	}
	// Built by hand (as a registry record holds it): options of an interface not required.
	hand := &manifest.Manifest{Module: "app", Requires: []string{"mesh-bus"}, Options: map[string]map[string]string{"postgres": {"schema": "app"}}}
	if rs := refusals(t, hand.Validate()); !slices.ContainsFunc(rs, func(r manifest.Refusal) bool { return r.Field == "requires.postgres" }) {
		t.Errorf("options of an interface not required: %v", rs)
	}
	for _, tc := range []struct{ name, yaml, instead string }{
		{"options as a list", "module: app\nrequires: [mesh-bus, {postgres: [a]}]\n", "- postgres: {connection-limit"},
		{"two interfaces in one item", "module: app\nrequires: [mesh-bus, {postgres: {a: b}, redis: {}}]\n", "- postgres: {connection-limit"},
		{"a name, not a list", "module: app\nrequires: postgres\n", "requires: [postgres]"},
	} {
		_, err := manifest.Parse([]byte(tc.yaml))
		if rs := refusals(t, err); len(rs) != 1 || !strings.Contains(rs[0].Instead, tc.instead) || rs[0].Line == 0 {
			t.Errorf("%s: refusals %v, want one with a line saying %q", tc.name, rs, tc.instead)
		}
	}
}

// TestRequires_DuplicateOption: an option written twice is the duplicate-key refusal, with
// its line.
func TestRequires_DuplicateOption(t *testing.T) {
	_, err := manifest.Parse([]byte("module: app\nrequires:\n  - mesh-bus\n  - postgres: {schema: a, schema: b}\n"))
	if rs := refusals(t, err); len(rs) != 1 || rs[0].Code != manifest.CodeDuplicate || rs[0].Line != 4 {
		t.Fatalf("a duplicate option: %v", rs)
	}
}
