package codehealth

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRaceListCoversGoroutines: every package whose code starts a goroutine, and has tests
// to run, is in .ci/run's `go test -race` list, so a package split out of another (or a new
// one) does not lose the race detector by being left off a hand-kept list.
func TestRaceListCoversGoroutines(t *testing.T) {
	raced := raceList(t)
	if len(raced) < 10 {
		t.Fatalf("read %d packages from .ci/run's go test -race: the parse missed the list", len(raced))
	}
	files := sources(t, func(string) bool { return true })
	tested := map[string]bool{}
	for rel := range files {
		if strings.HasSuffix(rel, "_test.go") {
			tested[filepath.Dir(rel)] = true
		}
	}
	starts := map[string]string{} // package dir → a file that starts a goroutine
	fset := token.NewFileSet()
	for rel, src := range files {
		dir := filepath.Dir(rel)
		if strings.HasSuffix(rel, "_test.go") || !tested[dir] || starts[dir] != "" {
			continue
		}
		f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if _, ok := n.(*ast.GoStmt); ok {
				starts[dir] = rel
			}
			return starts[dir] == ""
		})
	}
	if len(starts) == 0 {
		t.Fatal("found no package that starts a goroutine: the walk missed them")
	}
	for dir, file := range starts {
		if !raced[dir] {
			t.Errorf("%s starts goroutines but ./%s is not in .ci/run's go test -race list: add it there", file, dir)
		}
	}
}

// raceList is the set of package directories, from the repository's root, that .ci/run
// passes to `go test -race` (one command, continued over lines with a backslash).
func raceList(t *testing.T) map[string]bool {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	raced := map[string]bool{}
	in := false
	for _, line := range strings.Split(string(script), "\n") {
		fields := strings.Fields(line)
		if !in && !(len(fields) > 2 && fields[0] == "go" && fields[1] == "test" && slices.Contains(fields, "-race")) {
			continue
		}
		in = strings.HasSuffix(strings.TrimSpace(line), `\`)
		for _, f := range fields {
			if strings.HasPrefix(f, "./") {
				raced[filepath.Clean(f)] = true
			}
		}
		if !in {
			break
		}
	}
	return raced
}

// TestCIPassesTimeouts: every `go test` in .ci/run says its -timeout, so each tier's bound is
// written where its budget is, and a package near Go's default 10 minutes is not one slow
// machine away from a panic.
func TestCIPassesTimeouts(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, line := range strings.Split(string(script), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "go" || fields[1] != "test" {
			continue
		}
		n++
		if !slices.ContainsFunc(fields, func(f string) bool { return strings.HasPrefix(f, "-timeout") }) {
			t.Errorf(".ci/run:%d runs go test without -timeout: %s", i+1, strings.TrimSpace(line))
		}
	}
	if n == 0 {
		t.Fatal("found no go test in .ci/run: the parse missed them")
	}
}
