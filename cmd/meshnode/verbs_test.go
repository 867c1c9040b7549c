package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/formats"
	"github.com/spf13/cobra"
)

// noJSON are the verbs that print no records, each with why: what they print is a value
// itself, a node's own output, a link or a one-line confirmation.
var noJSON = map[string]string{
	"up": "runs a node", "run": "runs a node", "join": "runs a node", "leave": "a confirmation",
	"ui": "a login link", "logs": "a module's own output", "call": "the tool's reply, as the tool wrote it",
	"vault fetch": "the secret's value alone, for a pipe", "vault mint": "a confirmation", "vault rotate": "a confirmation",
	"context add": "a confirmation", "context use": "a confirmation", "context rm": "a confirmation",
	"git notify": "a confirmation", "cert rotate": "a confirmation", "node remove": "a confirmation",
	"node accept-loss": "a confirmation", "dead replay": "a confirmation per letter", "dead drop": "a confirmation",
	"dead show": "prints JSON only", "artifact rm": "a confirmation", "provisions pin": "a confirmation",
	"module remove": "a confirmation",
}

// nodeVerbs run or make a node on their data dir, or save one in a context: no context
// names it.
var nodeVerbs = map[string]bool{"up": true, "run": true, "join": true, "genesis": true, "context add": true}

// leaves returns every runnable command (one with subcommands too: provisions), by path
// after "meshnode ".
func leaves(c *cobra.Command) map[string]*cobra.Command {
	out := map[string]*cobra.Command{}
	for _, s := range c.Commands() {
		if s.Hidden || s.Name() == "help" || s.Name() == "completion" {
			continue
		}
		for k, v := range leaves(s) {
			out[k] = v
		}
		if s.Runnable() && s.Annotations[groupAnnotation] == "" {
			out[strings.TrimPrefix(s.CommandPath(), "meshnode ")] = s
		}
	}
	return out
}

// TestBinary_EveryVerb: every verb has examples in its help and exits 2 on a usage error (an
// unknown flag); every verb that prints records has --json, and the ones without say why
// (noJSON); the --json of version, emit's refusal aside, and module check parse.
func TestBinary_EveryVerb(t *testing.T) {
	all := leaves(newRootCmd())
	if len(all) < 40 {
		t.Fatalf("found %d verbs, want the whole tree", len(all))
	}
	for path, c := range all {
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("meshnode %s has no examples in its help", path)
		}
		if c.Flags().Lookup("json") == nil && noJSON[path] == "" {
			t.Errorf("meshnode %s prints without --json (or add it to noJSON, saying why)", path)
		}
		if c.Flags().Lookup("json") != nil {
			if _, _, err := jsonKeys(path); err != nil {
				t.Error(err) // TestIntegration_Binary_JSON checks the output against them
			}
		}
		if c.Flags().Lookup("data-dir") != nil && c.Flags().Lookup("context") == nil && !nodeVerbs[path] {
			t.Errorf("meshnode %s finds its node by data dir but takes no --context", path)
		}
		if r := meshnode(t, nil, append(strings.Fields(path), "--no-such-flag")...); r.code != 2 || !strings.Contains(r.stderr, "unknown flag") {
			t.Errorf("meshnode %s --no-such-flag: exit %d %q, want 2", path, r.code, r.stderr)
		}
	}
	for path := range noJSON {
		if all[path] == nil {
			t.Errorf("noJSON names %q, which is no verb", path)
		}
	}

	r := meshnode(t, nil, "version", "--json")
	var v versionReport
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != 0 || v.Version == "" || !strings.HasPrefix(v.GoVersion, "go") {
		t.Fatalf("version --json: exit %d %q %v", r.code, r.stdout, err)
	}
	if got, want := v.Formats, formats.All(); !maps.Equal(got, want) {
		t.Fatalf("version --json: formats %v, want %v", got, want)
	}
	good, bad := filepath.Join(t.TempDir(), "good.yaml"), filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(good, []byte("module: shop\nrequires: [mesh-bus]\nemits: [sold]\n"), 0o600)
	os.WriteFile(bad, []byte("module: Bad_Name\n"), 0o600)
	r = meshnode(t, nil, "module", "check", good, bad, "--json")
	var results []moduleCheckResult
	for line := range strings.Lines(r.stdout) {
		var m moduleCheckResult
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("module check --json: %v: %q", err, line)
		}
		results = append(results, m)
	}
	if r.code != 1 || len(results) != 2 || !results[0].OK || results[0].Module != "shop" || results[1].OK || len(results[1].Refusals) == 0 || results[1].Refusals[0].Instead == "" {
		t.Fatalf("module check --json: exit %d %+v", r.code, results)
	}
}

// TestBinary_BenchQuietWhenPiped: bench prints its figures on stdout and, with stderr not a
// terminal, no progress there.
func TestBinary_BenchQuietWhenPiped(t *testing.T) {
	r := meshnode(t, nil, "bench", "--events", "50", "--calls", "50", "--modules", "0")
	if r.code != 0 || !strings.Contains(r.stdout, "emit→on") {
		t.Fatalf("bench: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stderr, "throwaway node at") || strings.Contains(r.stderr, "level=INFO") {
		t.Fatalf("bench printed progress into a pipe: %s", r.stderr)
	}
}
