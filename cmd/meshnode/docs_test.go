package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/config"
	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"go.yaml.in/yaml/v3"
)

// updateDocs makes the docs tests write the reference instead of checking it: what
// `go generate ./cmd/meshnode` runs (generate.go). The generator lives in a test so that
// cobra/doc is never linked into the binary.
var updateDocs = flag.Bool("update-docs", false, "rewrite docs/cli/ and docs/configuration.md from the CLI and the configuration keys")

// regenerate is what every drift failure tells the reader to run.
const regenerate = "regenerate with `go generate ./cmd/meshnode` (or `go test -run '^TestDocs_' -update-docs ./cmd/meshnode`) and commit the result"

// TestDocs_CLI holds docs/cli/ to what the CLI says: one page per command, from cobra.
func TestDocs_CLI(t *testing.T) {
	want := cliPages(t)
	dir := filepath.Join("..", "..", "docs", "cli")
	if *updateDocs {
		old, _ := filepath.Glob(filepath.Join(dir, "*.md"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, page := range want {
			writeDoc(t, filepath.Join(dir, name), page)
		}
		return
	}
	have, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range have {
		if _, ok := want[filepath.Base(f)]; !ok {
			t.Errorf("docs/cli/%s documents no command of the CLI: %s", filepath.Base(f), regenerate)
		}
	}
	for name, page := range want {
		checkDoc(t, filepath.Join(dir, name), page)
	}
	checkCLIIndex(t, want)
}

// cliLink is a link from docs/cli.md to a command's page.
var cliLink = regexp.MustCompile(`\]\(cli/([^)#]+)\)`)

// checkCLIIndex holds docs/cli.md, the hand-written index, to the pages: every link leads to
// one, and every command of the root has a link.
func checkCLIIndex(t *testing.T, pages map[string][]byte) {
	t.Helper()
	index, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, m := range cliLink.FindAllStringSubmatch(string(index), -1) {
		linked[m[1]] = true
		if _, ok := pages[m[1]]; !ok {
			t.Errorf("docs/cli.md links to cli/%s, which documents no command: fix the link", m[1])
		}
	}
	root := newRootCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if page := "meshnode_" + c.Name() + ".md"; c.IsAvailableCommand() && !linked[page] {
			t.Errorf("docs/cli.md has no link to cli/%s: add `%s` to its list of every command", page, c.Name())
		}
	}
}

// TestDocs_Configuration holds docs/configuration.md to the configuration keys: each key's
// flag, environment variable, defaults and the doc comment of its field in package config.
func TestDocs_Configuration(t *testing.T) {
	page := configurationPage(t)
	path := filepath.Join("..", "..", "docs", "configuration.md")
	if *updateDocs {
		writeDoc(t, path, page)
		return
	}
	checkDoc(t, path, page)
}

// cliPages renders every available command with cobra/doc, by file name. The dates cobra
// would stamp on each page are turned off, so the pages change only when the CLI does.
func cliPages(t *testing.T) map[string][]byte {
	t.Helper()
	root := newRootCmd()
	root.InitDefaultCompletionCmd() // cobra adds it at Execute; users see it in --help
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.DisableAutoGenTag = true
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	dir := t.TempDir()
	if err := doc.GenMarkdownTree(root, dir); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pages[filepath.Base(f)] = b
	}
	if len(pages) < 30 {
		t.Fatalf("cobra rendered %d pages, expected one per command", len(pages))
	}
	return pages
}

// configurationPage renders docs/configuration.md.
func configurationPage(t *testing.T) []byte {
	t.Helper()
	root := newRootCmd()
	up, _, err := root.Find([]string{"up"})
	if err != nil {
		t.Fatal(err)
	}
	run, _, err := root.Find([]string{"run"})
	if err != nil {
		t.Fatal(err)
	}
	meanings := configComments(t)
	keys := config.Keys()
	slices.Sort(keys)

	var b bytes.Buffer
	b.WriteString(`# Configuration

<!-- Generated from package config and the CLI's flags by TestDocs_Configuration
(cmd/meshnode/docs_test.go); do not edit: change the field's comment in config/config.go
or the flag in cmd/meshnode/config.go, then run go generate ./cmd/meshnode. -->

Every setting of a node is a key of its configuration file, an environment variable and
(where the table names one) a flag of ` + "`meshnode up`, `run`, `genesis` and `join`" + `. Each comes from, in rising precedence:
the default, the YAML file, the environment variable, the flag. The file is ` + "`--config FILE`" + `
(or ` + "`MESHNODE_CONFIG`" + `), else ` + "`meshnode.yaml`" + ` in the data dir if present. Unknown keys and
unknown ` + "`MESHNODE_*`" + ` variables are errors that name the key meant.

Durations accept a day suffix: ` + "`7d`, `1d12h`, `90s`" + ` (at most ` + "`36500d`" + `). Sizes take a unit:
` + "`512MiB`, `20GiB`, `10GB`" + `. Lists are YAML lists in the file and comma-separated in the environment
and on the command line; ` + "`git-repos`" + ` is a mapping in the file and ` + "`name=/path,…`" + ` elsewhere.
The defaults are those of ` + "`meshnode up`" + ` (a single node on loopback) and of ` + "`meshnode run`" + `
(` + "`genesis` and `join`" + ` too: a service on every interface).

| key | flag | environment | ` + "`up`" + ` default | ` + "`run`" + ` default |
|---|---|---|---|---|
`)
	for _, key := range keys {
		flagCell, upDefault, runDefault := "none", "", ""
		if fu, fr := up.Flags().Lookup(key), run.Flags().Lookup(key); fu != nil && fr != nil {
			flagCell, upDefault, runDefault = "`--"+key+"`", defaultCell(fu.DefValue), defaultCell(fr.DefValue)
		} else {
			// A key without a flag: its defaults are the Config's.
			upDefault, runDefault = configDefault(t, config.Up(), key), configDefault(t, config.Run(), key)
		}
		fmt.Fprintf(&b, "| [`%s`](#%s) | %s | `%s` | %s | %s |\n", key, key, flagCell, config.EnvName(key), upDefault, runDefault)
	}
	for _, key := range keys {
		meaning, ok := meanings[key]
		if !ok {
			t.Fatalf("configuration key %s: its field in config/config.go has no doc comment; write one", key)
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s\n", key, meaning)
		if fl := up.Flags().Lookup(key); fl != nil && fl.Usage != "" {
			fmt.Fprintf(&b, "\n`--%s`: %s.\n", key, fl.Usage)
		}
	}
	return b.Bytes()
}

// defaultCell shows a flag's default in a table cell.
func defaultCell(v string) string {
	if v == "" {
		return "none"
	}
	return "`" + v + "`"
}

// configDefault shows a key's value in cfg in a table cell, as the file would write it.
func configDefault(t *testing.T, cfg config.Config, key string) string {
	t.Helper()
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	v, ok := m[key]
	if !ok {
		t.Fatalf("configuration key %s is not in the Config's YAML", key)
	}
	return defaultCell(fmt.Sprint(v))
}

// goIdent is the Go name a field's doc comment starts with.
var goIdent = regexp.MustCompile(`^[A-Z][A-Za-z]*\b`)

// configComments reads each configuration field's doc comment from config/config.go, by its
// yaml key, with the field's Go name replaced by the key.
func configComments(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("..", "..", "config", "config.go"), nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Config" {
			return true
		}
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			if field.Tag == nil || field.Doc == nil {
				continue
			}
			key, _, _ := strings.Cut(reflect.StructTag(strings.Trim(field.Tag.Value, "`")).Get("yaml"), ",")
			if key == "" || key == "-" {
				continue
			}
			text := strings.Join(strings.Fields(field.Doc.Text()), " ")
			out[key] = goIdent.ReplaceAllLiteralString(text, "`"+key+"`")
		}
		return false
	})
	return out
}

// checkDoc fails the test when the committed file at path is not want, naming the file and
// the first line that differs.
func checkDoc(t *testing.T, path string, want []byte) {
	t.Helper()
	rel := strings.TrimPrefix(filepath.ToSlash(path), "../../")
	have, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("%s: %v: %s", rel, err, regenerate)
		return
	}
	if bytes.Equal(have, want) {
		return
	}
	hl, wl := strings.Split(string(have), "\n"), strings.Split(string(want), "\n")
	i := 0
	for i < len(hl) && i < len(wl) && hl[i] == wl[i] {
		i++
	}
	line := func(ls []string) string {
		if i < len(ls) {
			return ls[i]
		}
		return "(end of file)"
	}
	t.Errorf("%s differs from what the code says, from line %d:\n  committed: %s\n  generated: %s\n%s", rel, i+1, line(hl), line(wl), regenerate)
}

// writeDoc writes a generated file.
func writeDoc(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
