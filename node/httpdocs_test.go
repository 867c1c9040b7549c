package node_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// route is a pattern registered on an http.ServeMux, with its method: "GET /readyz".
var route = regexp.MustCompile(`\.Handle(?:Func)?\("([A-Z]+ /[^"]*)"`)

// TestHTTP_Documented: docs/http.md names every route a ServeMux of the repository registers
// (the node's API and its dashboard, wherever they live) and every metric the node exports
// (testdata/metrics.golden), so the page cannot fall behind the code.
func TestHTTP_Documented(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../docs/http.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(page)
	routes := 0
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "examples" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range route.FindAllStringSubmatch(string(src), -1) {
			routes++
			if !strings.Contains(doc, "`"+m[1]+"`") {
				t.Errorf("%s registers %q, which docs/http.md does not name: add it to its table of routes", path, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if routes == 0 {
		t.Fatal("found no routes: the walk missed the node's HTTP API")
	}
	golden, err := os.ReadFile("testdata/metrics.golden")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(golden)) {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), " "); ok && !strings.Contains(doc, name) {
			t.Errorf("the node exports %s, which docs/http.md does not describe: add it to its table of metrics", name)
		}
	}
	for _, name := range regexp.MustCompile(`meshnode_[a-z_]+`).FindAllString(doc, -1) {
		if !strings.Contains(string(golden), name+" ") {
			t.Errorf("docs/http.md describes %s, which the node does not export (testdata/metrics.golden)", name)
		}
	}
}
