//go:build integration

package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestIntegration_Binary_Contexts: a saved context finds the node for every client verb — by data dir or
// by server and seed — and is chosen by `context use`, --context or MESHNODE_CONTEXT; flags and
// MESHNODE_SERVER / MESHNODE_CREDS win over it; bad input is a usage error (exit 2) or says
// what to do.
func TestIntegration_Binary_Contexts(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	defer p.stop(t, syscall.SIGTERM)
	home := []string{"XDG_CONFIG_HOME=" + t.TempDir()}
	run := func(env []string, args ...string) result {
		return meshnode(t, append(append([]string{}, home...), env...), args...)
	}

	// Nothing selected, nothing at the default data dirs: module ls cannot find a node.
	if r := run(nil, "module", "ls"); r.code == 0 {
		t.Fatalf("module ls with no context and no data dir: %s", r.stdout)
	}
	if r := run(nil, "context", "add", "here", "--data-dir", dir, "--select"); r.code != 0 || !strings.Contains(r.stdout, "context here selected") {
		t.Fatalf("context add --select: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := run(nil, "module", "ls", "--json"); r.code != 0 {
		t.Fatalf("module ls through the selected context: exit %d %s", r.code, r.stderr)
	}
	if r := run(nil, "status", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"name": "alpha"`) {
		t.Fatalf("status through the selected context: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	// By server and seed: another context, named per command and by the environment.
	op := filepath.Join(dir, "operator.nk")
	if r := run(nil, "context", "add", "remote", "--server", p.clientURL, "--creds", op, "--description", "the same node, by URL"); r.code != 0 {
		t.Fatalf("context add --server: exit %d %s", r.code, r.stderr)
	}
	for _, tc := range []struct {
		env  []string
		args []string
	}{{nil, []string{"--context", "remote"}}, {[]string{envContext + "=remote"}, nil}} {
		if r := run(tc.env, append([]string{"seat", "ls", "--json"}, tc.args...)...); r.code != 0 || !strings.Contains(r.stdout, "mesh-controller") {
			t.Fatalf("seat ls through context remote (%v %v): exit %d %s", tc.env, tc.args, r.code, r.stderr)
		}
	}
	// A verb that names its node otherwise uses no context at all: MESHNODE_SERVER does not
	// borrow the context's seed, and a flag wins over the environment.
	if r := run([]string{envContext + "=remote", envServer + "=nats://127.0.0.1:1"}, "module", "ls"); r.code == 0 || !strings.Contains(r.stderr, "no operator seed") {
		t.Fatalf("MESHNODE_SERVER with a context: exit %d %s, want the context's seed not lent", r.code, r.stderr)
	}
	if r := run([]string{envServer + "=nats://127.0.0.1:1"}, "module", "ls", "--server", p.clientURL, "--creds", op); r.code != 0 {
		t.Fatalf("--server over MESHNODE_SERVER: exit %d %s", r.code, r.stderr)
	}
	// An explicit data dir wins over a selected server context; status asks a server
	// context's node over its bus.
	if r := run(nil, "context", "use", "remote"); r.code != 0 {
		t.Fatalf("context use remote: %s", r.stderr)
	}
	if r := run(nil, "status", "--json", "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, `"name": "alpha"`) {
		t.Fatalf("status --data-dir with a server context selected: exit %d %s", r.code, r.stderr)
	}
	if r := run(nil, "status", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"name": "alpha"`) {
		t.Fatalf("status through a server context (over the bus): exit %d %s", r.code, r.stderr)
	}
	if r := run(nil, "context", "use", "here"); r.code != 0 {
		t.Fatalf("context use here: %s", r.stderr)
	}
	r := run(nil, "context", "ls", "--json")
	var rows []contextRow
	for line := range strings.Lines(r.stdout) {
		var row contextRow
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			t.Fatalf("context ls --json: %v: %q", err, line)
		}
		rows = append(rows, row)
	}
	if r.code != 0 || len(rows) != 2 || rows[0].Name != "here" || !rows[0].Selected || rows[0].DataDir != dir || rows[1].Server != p.clientURL || rows[1].Selected {
		t.Fatalf("context ls --json: exit %d %+v", r.code, rows)
	}

	// Refusals.
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"context", "add", "x"}, 2, "give --server (with --creds) or --data-dir"},
		{[]string{"context", "add", "x", "--server", "http://h:1", "--creds", op}, 2, "want nats://HOST:PORT"},
		{[]string{"context", "add", "x", "--server", "nats://h:1"}, 2, "needs --creds"},
		{[]string{"context", "add", "bad/name", "--data-dir", dir}, 2, "is not a context name"},
		{[]string{"context", "add", strings.Repeat("a", 65), "--data-dir", dir}, 2, "is not a context name"},
		{[]string{"context", "add", "x", "--data-dir", filepath.Join(dir, "nope")}, 1, "no such file"},
		{[]string{"context", "use", "nope"}, 1, "no context \"nope\""},
		{[]string{"module", "ls", "--context", "nope"}, 1, "meshnode context ls"},
	} {
		if r := run(nil, tc.args...); r.code != tc.code || !strings.Contains(r.stderr, tc.stderr) {
			t.Errorf("%v: exit %d %s, want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.stderr)
		}
	}
	if r := run(nil, "context", "rm", "here"); r.code != 0 {
		t.Fatalf("context rm: exit %d %s", r.code, r.stderr)
	}
	if r := run(nil, "context", "ls", "--json"); strings.Contains(r.stdout, `"selected":true`) {
		t.Fatalf("the removed context is still selected: %s", r.stdout)
	}
}
