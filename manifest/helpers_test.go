package manifest_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// The tests' own NATS subject matcher, written apart from the package's so the properties do
// not check the package against itself. * is one token, > one or more at the end.

// match reports whether the literal subject matches pattern.
func match(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for len(p) > 0 {
		switch {
		case p[0] == ">":
			return len(s) > 0
		case len(s) == 0:
			return false
		case p[0] != "*" && p[0] != s[0]:
			return false
		}
		p, s = p[1:], s[1:]
	}
	return len(s) == 0
}

// within reports whether every subject pattern b matches is matched by a.
func within(a, b string) bool {
	return withinTokens(strings.Split(a, "."), strings.Split(b, "."))
}

func withinTokens(a, b []string) bool {
	switch {
	case len(a) == 0:
		return len(b) == 0
	case a[0] == ">":
		return len(b) > 0
	case len(b) == 0:
		return false
	case b[0] == ">":
		return false
	case a[0] == "*":
		return withinTokens(a[1:], b[1:])
	case b[0] == "*":
		return false
	case a[0] != b[0]:
		return false
	}
	return withinTokens(a[1:], b[1:])
}

// collide reports whether some subject matches both patterns.
func collide(a, b string) bool {
	return collideTokens(strings.Split(a, "."), strings.Split(b, "."))
}

func collideTokens(a, b []string) bool {
	switch {
	case len(a) == 0 || len(b) == 0:
		return len(a) == 0 && len(b) == 0
	case a[0] == ">":
		return true
	case b[0] == ">":
		return true
	case a[0] == "*" || b[0] == "*" || a[0] == b[0]:
		return collideTokens(a[1:], b[1:])
	}
	return false
}

func TestMatcher(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"mesh.*.*.event.>", "mesh.mod.billing.event.order.placed", true},
		{"mesh.*.*.event.>", "mesh.mod.billing.tool.status", false},
		{"mesh.*.*.event.>", "mesh.mod.billing.event", false},
		{"a.*", "a.b.c", false},
		{"a.>", "a", false},
		{"a.b", "a.b", true},
	} {
		if got := match(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("match(%q, %q)=%v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
	if !within("a.>", "a.*.c") || within("a.*.c", "a.>") || !within("a.*", "a.b") || within("a.b", "a.*") {
		t.Fatal("within is wrong")
	}
	if !collide("a.*.c", "a.b.*") || collide("a.b", "a.c") || !collide("a.>", "a.b.c") || collide("a.b.>", "a.b") {
		t.Fatal("collide is wrong")
	}
}

// mustParse parses a manifest the test expects to be valid.
func mustParse(tb testing.TB, yaml string) *manifest.Manifest {
	tb.Helper()
	m, err := manifest.Parse([]byte(yaml))
	if err != nil {
		tb.Fatalf("Parse: %v", err)
	}
	if err := m.Validate(); err != nil {
		tb.Fatalf("Validate: %v", err)
	}
	return m
}

// mustDerive derives a manifest the test expects to be valid.
func mustDerive(tb testing.TB, yaml string) *manifest.Derivation {
	tb.Helper()
	d, err := mustParse(tb, yaml).Derive()
	if err != nil {
		tb.Fatalf("Derive: %v", err)
	}
	return d
}

// refusals returns err's refusals, failing if err is another kind of error.
func refusals(tb testing.TB, err error) manifest.Refusals {
	tb.Helper()
	if err == nil {
		return nil
	}
	var rs manifest.Refusals
	if !errors.As(err, &rs) {
		tb.Fatalf("error %v (%T) is not Refusals", err, err)
	}
	return rs
}

// loadCatalogue parses and validates every manifest in testdata/catalogue.
func loadCatalogue(tb testing.TB) (map[string][]byte, []*manifest.Manifest) {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "catalogue", "*.yaml"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no catalogue: %v", err)
	}
	raw := map[string][]byte{}
	var ms []*manifest.Manifest
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		m, err := manifest.Parse(data)
		if err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		if err := m.Validate(); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		raw[f] = data
		ms = append(ms, m)
	}
	return raw, ms
}

// without returns ms without the manifest of module.
func without(ms []*manifest.Manifest, module string) []*manifest.Manifest {
	return slices.DeleteFunc(slices.Clone(ms), func(m *manifest.Manifest) bool { return m.Module == module })
}
