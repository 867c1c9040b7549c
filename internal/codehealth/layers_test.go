package codehealth

import (
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// module is the repository's module path.
const module = "github.com/meshnode/meshnode/"

// layers is DESIGN §1's layering (docs/layers.md), lowest first. A package imports only
// packages listed before it: in a lower layer, or earlier in its own, so the services of one
// layer never import each other upwards. A path ending in /... stands for every package
// under it. A package that is not listed fails TestLayers until it is added here, where its
// imports put it; a listed one that does not exist yet (parts other work is creating) is
// skipped.
var layers = []struct {
	name string
	pkgs []string
}{
	{"bottom: the declaration model, the wire, the envelope and small helpers", []string{
		"internal/suggest", "internal/boundedmap", "internal/backoff", "internal/heapfloor",
		"manifest", "api", "envelope",
		"internal/jsretry", "internal/jsconsume", "internal/lifecycle", "internal/ensure", "mirror", "outbox", "throttle", "floodwatch", "toolstats", "meshca", "recovery", "alarm",
	}},
	{"stores and services", []string{
		"config", "embedbus", "membership", "genesis", "datadir", "sandbox",
		"seats", "audit", "artifact", "vault", "metrics", "deploy", "registry", "provision", "build", "deadletter", "streammove", "snapshot", "formats", "replication", "admit",
	}},
	{"parts that compose services, and the clients of the bus", []string{
		"admin", "sdk", "sdk/dedupbolt", "host", "controller", "dashboard", "provenance", "site",
	}},
	{"top: the composition root, the commands, examples and test support", []string{
		"bench", "node", "cmd/...", "examples/...",
		"internal/testbed", "chaos", "internal/codehealth/errortext", "internal/codehealth", "internal/wiregolden",
	}},
}

// rank returns where path (relative to the module) stands in layers and its layer's name.
func rank(path string) (int, string, bool) {
	i := 0
	for _, l := range layers {
		for _, p := range l.pkgs {
			if p == path || (strings.HasSuffix(p, "/...") && strings.HasPrefix(path, strings.TrimSuffix(p, "..."))) {
				return i, l.name, true
			}
			i++
		}
	}
	return 0, "", false
}

// TestLayers: every package of the repository is in layers, and imports only packages below
// it there (its tests may import anything).
func TestLayers(t *testing.T) {
	seen := map[string]bool{}
	for _, l := range layers {
		for _, p := range l.pkgs {
			if seen[p] {
				t.Errorf("layers lists %s twice", p)
			}
			seen[p] = true
		}
	}
	pkgs := load(t, packages.NeedName|packages.NeedImports, "./...")
	if len(pkgs) < 30 {
		t.Fatalf("loaded %d packages: the load missed the repository", len(pkgs))
	}
	for _, p := range pkgs {
		path := strings.TrimPrefix(p.PkgPath, module)
		at, layer, ok := rank(path)
		if !ok {
			t.Errorf("package %s is in no layer: add it to layers in internal/codehealth/layers_test.go (and docs/layers.md), in the layer it belongs to and after every package it imports", path)
			continue
		}
		for imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			depAt, depLayer, ok := rank(dep)
			if !ok || depAt < at {
				continue // an unlisted package is reported as such
			}
			t.Errorf("%s (%s) imports %s (%s), which is not below it: give %s a small type of its own for the data it needs, "+
				"or hand it a function (DESIGN §1: layers import downwards only); if %s truly belongs above %s, move it in layers and docs/layers.md",
				path, layer, dep, depLayer, path, path, dep)
		}
	}
}

// TestSDKLinksNoServer: a module's Go library links neither nats-server nor bbolt (a module
// that wants dedup across restarts opts into bbolt with sdk/dedupbolt).
func TestSDKLinksNoServer(t *testing.T) {
	pkgs := load(t, packages.NeedName|packages.NeedImports|packages.NeedDeps, "./sdk")
	n := 0
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		n++
		for _, banned := range []string{"github.com/nats-io/nats-server/", "go.etcd.io/bbolt"} {
			if strings.HasPrefix(p.PkgPath, banned) {
				t.Errorf("sdk links %s: find the import that pulls it in with `go list -deps ./sdk` and cut it (wire types belong in api/)", p.PkgPath)
			}
		}
	})
	if n < 10 {
		t.Fatalf("visited %d packages under sdk: the load missed its dependencies", n)
	}
}

// TestAPIIsALeaf: the wire package imports the standard library and manifest only, so every
// client can link it.
func TestAPIIsALeaf(t *testing.T) {
	for _, p := range load(t, packages.NeedName|packages.NeedImports, "./api") {
		for imp := range p.Imports {
			std := !strings.Contains(strings.Split(imp, "/")[0], ".")
			if !std && imp != module+"manifest" {
				t.Errorf("api imports %s: it may import only the standard library and manifest", imp)
			}
		}
	}
}

// load loads the repository's packages that patterns name, failing on any error.
func load(t *testing.T, mode packages.LoadMode, patterns ...string) []*packages.Package {
	t.Helper()
	pkgs, err := packages.Load(&packages.Config{Mode: mode, Dir: "../.."}, patterns...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		for _, e := range p.Errors {
			t.Errorf("load %s: %v", p.PkgPath, e)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return pkgs
}
