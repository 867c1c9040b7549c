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

// TestIntegration_Binary_ModuleRegisterSeed: module register checks --creds-out before the mesh mints
// anything (a missing directory, an existing file), refuses a manifest over the size limit,
// and a lost seed is recovered with --rotate-key: a new key, written to a new file, and the
// old seed refused. Before, a --creds-out into a missing directory registered the module
// and lost its only seed.
func TestIntegration_Binary_ModuleRegisterSeed(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	defer p.stop(t, syscall.SIGTERM)
	work := t.TempDir()
	path := filepath.Join(work, "shop.yaml")
	if err := os.WriteFile(path, []byte("module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dd := []string{"--data-dir", dir}
	ls := func() string {
		t.Helper()
		r := meshnode(t, nil, append([]string{"module", "ls"}, dd...)...)
		if r.code != 0 {
			t.Fatalf("module ls: exit %d %s", r.code, r.stderr)
		}
		return r.stdout
	}

	missing := filepath.Join(work, "no-such-dir", "shop.nk")
	r := meshnode(t, nil, append([]string{"module", "register", path, "--creds-out", missing}, dd...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "does not exist") || !strings.Contains(r.stderr, "nothing was registered") {
		t.Fatalf("register into a missing directory: exit %d %s", r.code, r.stderr)
	}
	if out := ls(); strings.Contains(out, "shop") {
		t.Fatalf("a refused --creds-out registered the module:\n%s", out)
	}
	taken := filepath.Join(work, "taken.nk")
	os.WriteFile(taken, []byte("keep me\n"), 0o600)
	if r := meshnode(t, nil, append([]string{"module", "register", path, "--creds-out", taken}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("register onto an existing file: exit %d %s", r.code, r.stderr)
	}
	if b, _ := os.ReadFile(taken); string(b) != "keep me\n" {
		t.Fatalf("an existing --creds-out was overwritten: %q", b)
	}

	big := filepath.Join(work, "big.yaml")
	os.WriteFile(big, []byte("module: big\nrequires: [mesh-bus]\n"+strings.Repeat("# padding padding padding padding padding padding padding padding\n", 12000)), 0o600)
	if r := meshnode(t, nil, append([]string{"module", "register", big, "--creds-out", filepath.Join(work, "big.nk")}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "65536") {
		t.Fatalf("register of a 780 KB manifest: exit %d %s; want a refusal naming the 65536-byte limit", r.code, r.stderr)
	}

	first := filepath.Join(work, "shop.nk")
	if r := meshnode(t, nil, append([]string{"module", "register", path, "--creds-out", first}, dd...)...); r.code != 0 {
		t.Fatalf("register: exit %d %s", r.code, r.stderr)
	}
	emit := func(seed string) result {
		return meshnode(t, nil, append([]string{"emit", "order.placed", `{"id":1}`, "--creds", seed}, dd...)...)
	}
	if r := emit(first); r.code != 0 {
		t.Fatalf("emit with the first seed: exit %d %s", r.code, r.stderr)
	}

	// The seed is lost (a copy is kept here, to show it stops working): a new key, through
	// the vault, to a new file.
	old := filepath.Join(t.TempDir(), "old.nk")
	if err := os.WriteFile(old, mustRead(t, first), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(first)
	second := filepath.Join(work, "shop-new.nk")
	r = meshnode(t, nil, append([]string{"module", "register", path, "--rotate-key", "--creds-out", second, "--json"}, dd...)...)
	if r.code != 0 {
		t.Fatalf("register --rotate-key: exit %d %s", r.code, r.stderr)
	}
	var out struct {
		Rotated bool
		Creds   string
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || !out.Rotated || out.Creds != second {
		t.Fatalf("register --rotate-key --json: %q (%v)", r.stdout, err)
	}
	if r := emit(second); r.code != 0 {
		t.Fatalf("emit with the rotated seed: exit %d %s", r.code, r.stderr)
	}
	if r := emit(old); r.code != 1 || !strings.Contains(r.stderr, "refused") {
		t.Fatalf("emit with the old seed after rotation: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"module", "register", filepath.Join(work, "nope.yaml"), "--rotate-key"}, dd...)...); r.code != 1 {
		t.Fatalf("register --rotate-key of a missing file: exit %d", r.code)
	}
	ghost := filepath.Join(work, "ghost.yaml")
	os.WriteFile(ghost, []byte("module: ghost\nrequires: [mesh-bus]\n"), 0o600)
	if r := meshnode(t, nil, append([]string{"module", "register", ghost, "--rotate-key", "--creds-out", filepath.Join(work, "ghost.nk")}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "not registered") {
		t.Fatalf("--rotate-key of an unregistered module: exit %d %s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(work, "ghost.nk")); err == nil {
		t.Fatal("a refused registration left its --creds-out file behind")
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
