//go:build integration

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestIntegration_Binary_GenesisVaultToken: genesis creates a mesh and hands off; run starts it; the
// operator mints, rotates, lists and fetches secrets and makes join tokens with the CLI.
func TestIntegration_Binary_GenesisVaultToken(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--data-dir", dir, "--name", "alpha", "--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-level", "error"}
	r := meshnode(t, nil, append([]string{"genesis", "--json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("genesis: exit %d %s", r.code, r.stderr)
	}
	checkJSON(t, "genesis", r.stdout)
	var out map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("genesis --json: %v %q", err, r.stdout)
	}
	if out["mesh_id"] == "" || out["operator_creds"] != filepath.Join(dir, "operator.nk") {
		t.Fatalf("genesis --json: %v", out)
	}
	if st, err := os.Stat(filepath.Join(dir, "operator.nk")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("operator.nk: %v %v", st, err)
	}
	if r := meshnode(t, nil, append([]string{"genesis"}, args...)...); r.code != 1 || !strings.Contains(r.stderr, "meshnode run") {
		t.Fatalf("second genesis: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, "genesis", "--data-dir", t.TempDir(), "--expect", "2"); r.code != 2 || !strings.Contains(r.stderr, "majority") {
		t.Fatalf("genesis --expect 2: exit %d %s", r.code, r.stderr)
	}
	r3 := meshnode(t, nil, "genesis", "--data-dir", t.TempDir(), "--name", "a", "--expect", "3", "--json")
	if r3.code != 0 || !strings.Contains(r3.stdout, `"founding_token":"MNF1.`) {
		t.Fatalf("genesis --expect 3: exit %d %s %s", r3.code, r3.stdout, r3.stderr)
	}

	p := startNode(t, "run", args[:len(args)-2]...)
	if p.meshID != out["mesh_id"] {
		t.Fatalf("run: mesh %s, genesis made %s", p.meshID, out["mesh_id"])
	}
	dd := []string{"--data-dir", dir}
	for _, c := range [][]string{
		{"vault", "mint", "smtp"},
		{"vault", "rotate", "smtp", "--grace", "1h"},
	} {
		if r := meshnode(t, nil, append(c, dd...)...); r.code != 0 {
			t.Fatalf("%v: exit %d %s", c, r.code, r.stderr)
		}
	}
	r = meshnode(t, nil, append([]string{"vault", "fetch", "smtp"}, dd...)...)
	v2 := strings.TrimSpace(r.stdout)
	if r.code != 0 || len(v2) != 43 {
		t.Fatalf("vault fetch: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	r = meshnode(t, nil, append([]string{"vault", "fetch", "smtp", "--version", "1"}, dd...)...)
	if v1 := strings.TrimSpace(r.stdout); r.code != 0 || v1 == v2 || len(v1) != 43 {
		t.Fatalf("vault fetch --version 1: exit %d %q", r.code, r.stdout)
	}
	r = meshnode(t, nil, append([]string{"vault", "ls"}, dd...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "smtp") || strings.Contains(r.stdout, v2) {
		t.Fatalf("vault ls: exit %d %s", r.code, r.stdout)
	}
	if r := meshnode(t, nil, append([]string{"vault", "fetch", "nope"}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "does not exist") {
		t.Fatalf("vault fetch of nothing: exit %d %s", r.code, r.stderr)
	}
	// A module's secret fetched without --owner: the refusal names its owner.
	if r := meshnode(t, nil, append([]string{"vault", "mint", "api-key", "--owner", "shop"}, dd...)...); r.code != 0 {
		t.Fatalf("vault mint --owner shop: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"vault", "fetch", "api-key"}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "A secret api-key is shop's: add --owner shop") {
		t.Fatalf("vault fetch of a module's secret without --owner: exit %d %s", r.code, r.stderr)
	}
	r = meshnode(t, nil, append([]string{"token", "create", "--ttl", "10m", "--json"}, dd...)...)
	if r.code != 0 || !strings.Contains(r.stdout, `"token":"MNJ1.`) {
		t.Fatalf("token create: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	// A single node's token cannot add a node; the joining node says so without spending it.
	var tok struct{ Token string }
	json.Unmarshal([]byte(r.stdout), &tok)
	if r := meshnode(t, nil, "join", "--token", tok.Token, "--data-dir", t.TempDir(), "--name", "second"); r.code != 1 || !strings.Contains(r.stderr, "a single node") || !strings.Contains(r.stderr, "the token is unused") {
		t.Fatalf("join with a single node's token: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"token", "create", "--uses", "0"}, dd...)...); r.code != 2 {
		t.Fatalf("token create --uses 0: exit %d", r.code)
	}
	if code, _ := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
}
