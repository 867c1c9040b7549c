// Package codehealth holds tests that read the repository's own source for habits the
// project has given up (issue 13), and for its layering (DESIGN §1, docs/layers.md).
package codehealth

import (
	"go/ast"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/codehealth/errortext"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"
)

// TestNoErrorsToldApartByText: control flow never reads an error's message; errors are told
// apart by type and code (errors.Is/As, jetstream.APIError.ErrorCode). The errortext
// analyzer runs over every package of the repository (built for this machine, without test
// files: tests may read messages, since they check what a person is told), and any finding
// fails. allowedErrorText lists the functions that read a message on purpose, and why.
func TestNoErrorsToldApartByText(t *testing.T) {
	pkgs := load(t, packages.LoadSyntax, "./...")
	if len(pkgs) < 30 {
		t.Fatalf("loaded %d packages: the load missed the repository", len(pkgs))
	}
	graph, err := checker.Analyze([]*analysis.Analyzer{errortext.Analyzer}, pkgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := filepath.Abs("../..")
	used := map[string]bool{}
	for act := range graph.All() {
		if act.Err != nil {
			t.Errorf("errortext on %s: %v", act.Package.PkgPath, act.Err)
		}
		for _, d := range act.Diagnostics {
			pos := act.Package.Fset.Position(d.Pos)
			fn := enclosingFunc(act.Package, d.Pos)
			if _, ok := allowedErrorText[act.Package.PkgPath+"."+fn]; ok {
				used[act.Package.PkgPath+"."+fn] = true
				continue
			}
			rel, _ := filepath.Rel(root, pos.Filename)
			t.Errorf("%s:%d (in %s) %s", rel, pos.Line, fn, d.Message)
		}
	}
	for fn := range allowedErrorText {
		if !used[fn] {
			t.Errorf("allowedErrorText lists %s, which reads no error's message any more: drop it from the list", fn)
		}
	}
}

// allowedErrorText are the functions (package path, then function) that read an error's
// message on purpose, each with why.
var allowedErrorText = map[string]string{
	"github.com/meshnode/meshnode/manifest.decodeRefusals": "yaml.v3 puts a syntax error's line only in its message; " +
		"the match moves it into the refusal a person reads, and decides nothing else",
	"github.com/meshnode/meshnode/membership.unreachable": "memberlist.Join wraps its dial errors with %v (memberlist v0.7.0), " +
		"so their types are lost and the text is all that is left",
	"github.com/meshnode/meshnode/sdk.AsRefusal": "told apart by type first (errors.Is nats.ErrPermissionViolation); " +
		"the text is read only for the refused subject and operation, which nats-server puts nowhere else",
}

// enclosingFunc names the function declared around pos (Type.Method for a method), or "".
func enclosingFunc(p *packages.Package, pos token.Pos) string {
	for _, f := range p.Syntax {
		if pos < f.Pos() || pos >= f.End() {
			continue
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || pos < fd.Pos() || pos >= fd.End() {
				continue
			}
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				return types.ExprString(fd.Recv.List[0].Type) + "." + fd.Name.Name
			}
			return fd.Name.Name
		}
	}
	return ""
}

// skipCall matches a test skipping itself other than through testbed.Skip.
var skipCall = regexp.MustCompile(`\w\.Skip(f|Now)?\(`)

// TestSkipsSayWhyAndFailInCI: every skip goes through testbed.Skip, which fails the test
// where CI says every bed must run, so a bed that cannot run there is a red run, not a
// silent green one.
func TestSkipsSayWhyAndFailInCI(t *testing.T) {
	tests := sources(t, func(path string) bool { return strings.HasSuffix(path, "_test.go") })
	if len(tests) < 30 {
		t.Fatalf("read %d test files: the walk missed the repository", len(tests))
	}
	for rel, src := range tests {
		for i, line := range strings.Split(src, "\n") {
			if skipCall.MatchString(line) && !strings.Contains(line, "testbed.Skip(") {
				t.Errorf("%s:%d skips other than through testbed.Skip: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// testFunc matches a test function's declaration and captures its name.
var testFunc = regexp.MustCompile(`(?m)^func (Test\w*)\(`)

// TestIntegrationTierIsNamed: the beds behind the integration build tag are exactly the
// tests named TestIntegration_*, the pattern CI's integration step runs, so none is
// built there and never run, and none of the fast tier runs twice. The fault harness's
// TestChaos (the name issue 38 gives it) is the one other: .ci/run runs it by name.
func TestIntegrationTierIsNamed(t *testing.T) {
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), "-run '^TestChaos$' ./chaos") {
		t.Errorf(".ci/run does not run the fault harness: add go test -tags integration -run '^TestChaos$' ./chaos")
	}
	tagged := 0
	for rel, src := range sources(t, func(path string) bool { return strings.HasSuffix(path, "_test.go") }) {
		integration := strings.HasPrefix(src, "//go:build integration\n")
		for _, m := range testFunc.FindAllStringSubmatch(src, -1) {
			if m[1] == "TestMain" {
				continue // the package's set-up, not a test
			}
			named := strings.HasPrefix(m[1], "TestIntegration_") || (rel == "chaos/chaos_integration_test.go" && m[1] == "TestChaos")
			switch {
			case integration && !named:
				t.Errorf("%s: %s is behind the integration tag but not named TestIntegration_*: CI would never run it", rel, m[1])
			case !integration && named:
				t.Errorf("%s: %s is named TestIntegration_* but not behind the integration tag: CI would run it twice", rel, m[1])
			case integration:
				tagged++
			}
		}
	}
	if tagged == 0 {
		t.Fatal("found no integration beds: the walk missed them")
	}
}

// sources returns the repository's Go files that keep says to, by path from the root.
func sources(t *testing.T, keep func(path string) bool) map[string]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || !keep(path) {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files[rel] = string(src)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
