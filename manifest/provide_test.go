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
