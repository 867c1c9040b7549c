package manifest_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// TestBuild_Validate: build.from is a repository name and a clean path in it, never a host
// or URL; run goes with it; build.on needs both.
func TestBuild_Validate(t *testing.T) {
	m := mustParse(t, "module: cart\nbuild: {from: shop/services/cart, run: go build -o \"$OUT\" .}\n")
	if repo, path := m.BuildSource(); repo != "shop" || path != "services/cart" || !m.Built() {
		t.Fatalf("BuildSource %q %q", repo, path)
	}
	if _, path := mustParse(t, "module: all\nbuild: {from: mono, run: make}\n").BuildSource(); path != "." {
		t.Fatalf("a repository's root: %q", path)
	}
	for _, tc := range []struct{ name, build, field string }{
		{"a URL", "{from: https://github.com/x/y, run: make}", "build.from"},
		{"a host", "{from: git.example.com/y, run: make}", "build.from"},
		{"a path out of the repository", "{from: shop/../etc, run: make}", "build.from"},
		{"an absolute path", "{from: shop//etc, run: make}", "build.from"},
		{"no run", "{from: shop/cart}", "build.run"},
		{"run without from", "{run: make}", "build.from"},
		{"on without from", "{on: [base]}", "build.on"},
	} {
		m, err := manifest.Parse([]byte("module: cart\nbuild: " + tc.build + "\n"))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		rs := refusals(t, m.Validate())
		if !slices.ContainsFunc(rs, func(r manifest.Refusal) bool { return r.Field == tc.field && r.Code == manifest.CodeBuild }) {
			t.Errorf("%s: refusals %v, want one at %s", tc.name, rs, tc.field)
		}
	}
}

// TestBuild_Catalogue: a cycle across the catalogue is refused naming it; build.on may not
// name a registered module the mesh does not build; a module others are built on keeps its
// build.
func TestBuild_Catalogue(t *testing.T) {
	built := func(name string, on ...string) *manifest.Manifest {
		y := "module: " + name + "\nbuild: {from: repo/" + name + ", run: make"
		if len(on) > 0 {
			y += ", on: [" + strings.Join(on, ", ") + "]"
		}
		return mustParse(t, y+"}\n")
	}
	catalogue := []*manifest.Manifest{built("base"), built("a", "base"), built("b", "a"), mustParse(t, "module: plain\n")}
	err := manifest.CheckCatalogue(built("base", "b"), catalogue, catalogue[0])
	if err == nil || !strings.Contains(err.Error(), "base → b → a → base") {
		t.Fatalf("a cycle: %v, want it named", err)
	}
	if err := manifest.CheckCatalogue(built("c", "plain"), catalogue, nil); err == nil || !strings.Contains(err.Error(), "does not build") {
		t.Fatalf("on a module not built: %v", err)
	}
	if err := manifest.CheckCatalogue(mustParse(t, "module: a\n"), catalogue, catalogue[1]); err == nil || !strings.Contains(err.Error(), "module b is built on a") {
		t.Fatalf("a module others are built on stops being built: %v", err)
	}
	if err := manifest.CheckCatalogue(built("d", "a", "b"), catalogue, nil); err != nil {
		t.Fatalf("a diamond is no cycle: %v", err)
	}
}
