package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestCompletion_EveryNameCompletes: every positional argument whose usage names a module,
// node, seat, dead letter, version, target, tool or existing name, and every --nodes, --node,
// --owner, --context and string --version, has a completion; names being made (context add,
// vault mint, artifact put's --version) have none.
func TestCompletion_EveryNameCompletes(t *testing.T) {
	named := []string{"MODULE", "NODE", "SEAT", "ID", "VERSION", "TARGET", "TOOL", "NAME"}
	made := []string{"meshnode context add", "meshnode vault mint"}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.Runnable() {
			return
		}
		path := c.CommandPath()
		for i, tok := range positionals(c.Use) {
			if !slices.Contains(named, tok) || slices.Contains(made, path) {
				continue
			}
			if args := completions[path].args; c.ValidArgsFunction == nil || len(args) <= i || args[i] == "" {
				t.Errorf("%s: argument %d (%s) completes nothing", path, i+1, tok)
			}
		}
		for _, flag := range []string{"nodes", "node", "owner", "context", "version"} {
			f := c.Flags().Lookup(flag)
			if f == nil || (flag == "version" && f.Value.Type() != "string") {
				continue
			}
			if path+" --"+flag == "meshnode artifact put --version" {
				continue // a version being stored
			}
			if _, ok := c.GetFlagCompletionFunc(flag); !ok {
				t.Errorf("%s --%s completes nothing", path, flag)
			}
		}
	}
	walk(newRootCmd())
}

// positionals are the placeholders of a usage line's positional arguments: "replay ID|--all"
// → [ID]; flags, optional and alternative groups end them.
func positionals(use string) []string {
	var out []string
	for _, tok := range strings.Fields(use)[1:] {
		if strings.ContainsAny(tok[:1], "[(-|") {
			break
		}
		out = append(out, strings.SplitN(tok, "|", 2)[0])
	}
	return out
}

// TestCompletion_CommaSeparatedAndContexts: a comma-separated flag completes its last name,
// keeping those before; the saved contexts complete `context use` and --context without a
// node.
func TestCompletion_CommaSeparatedAndContexts(t *testing.T) {
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	if err := os.MkdirAll(filepath.Join(cfg, "meshnode", "contexts"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"prod", "staging", "dev"} {
		os.WriteFile(filepath.Join(cfg, "meshnode", "contexts", name+".json"), []byte(`{"server":"nats://h:1","creds":"x"}`), 0o600)
	}
	root := newRootCmd()
	use, _, _ := root.Find([]string{"context", "use"})
	if got, _ := use.ValidArgsFunction(use, nil, "p"); !slices.Equal(got, []string{"prod"}) {
		t.Errorf("context use p<TAB>: %v, want [prod]", got)
	}
	status, _, _ := root.Find([]string{"status"})
	f, _ := status.GetFlagCompletionFunc("context")
	if got, _ := f(status, nil, "s"); !slices.Equal(got, []string{"staging"}) {
		t.Errorf("status --context s<TAB>: %v, want [staging]", got)
	}
	// As --nodes a,b completes: the last name, after those before.
	if got, _ := completeFlag(namesContext)(status, nil, "dev,p"); !slices.Equal(got, []string{"dev,prod"}) {
		t.Errorf("dev,p<TAB>: %v, want [dev,prod]", got)
	}
}
