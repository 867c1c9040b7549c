package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestBinary_GenesisRefusesMeshData: genesis and up refuse a data dir that holds any of a
// mesh's data — an empty or missing meshnode.db beside a JetStream store and an operator seed,
// or a seed alone — naming what they found, and leave the operator's seed alone; run on a
// damaged store says so instead of advising genesis. Before, a zero-length meshnode.db passed
// for an empty data dir and genesis overwrote operator.nk.
func TestBinary_GenesisRefusesMeshData(t *testing.T) {
	dir := t.TempDir()
	flags := func(dir string) []string {
		return []string{"--data-dir", dir, "--name", "alpha", "--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-level", "error"}
	}
	if r := meshnode(t, nil, append([]string{"genesis"}, flags(dir)...)...); r.code != 0 {
		t.Fatalf("genesis: exit %d %s", r.code, r.stderr)
	}
	seedPath := filepath.Join(dir, "operator.nk")
	seed, err := os.ReadFile(seedPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "jetstream")); err != nil {
		t.Fatalf("genesis left no JetStream store: %v", err)
	}
	seedKept := func(after string) {
		t.Helper()
		if got, err := os.ReadFile(seedPath); err != nil || !bytes.Equal(got, seed) {
			t.Fatalf("after %s, operator.nk changed (%v)", after, err)
		}
	}

	t.Run("EmptyStore", func(t *testing.T) {
		if err := os.Truncate(filepath.Join(dir, "meshnode.db"), 0); err != nil {
			t.Fatal(err)
		}
		r := meshnode(t, nil, append([]string{"run"}, flags(dir)...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "damaged") || strings.Contains(r.stderr, "meshnode genesis") {
			t.Fatalf("run on an empty store: exit %d %s; want 1 saying the store is damaged, not advising genesis", r.code, r.stderr)
		}
		for _, verb := range []string{"genesis", "up"} {
			r := meshnode(t, nil, append([]string{verb}, flags(dir)...)...)
			if r.code != 1 || !strings.Contains(r.stderr, "meshnode.db") || !strings.Contains(r.stderr, "empty") {
				t.Fatalf("%s on an empty store: exit %d %s; want 1 naming the empty meshnode.db", verb, r.code, r.stderr)
			}
			seedKept(verb)
		}
	})
	t.Run("NoStore", func(t *testing.T) {
		if err := os.Remove(filepath.Join(dir, "meshnode.db")); err != nil {
			t.Fatal(err)
		}
		for _, verb := range []string{"genesis", "up"} {
			r := meshnode(t, nil, append([]string{verb}, flags(dir)...)...)
			if r.code != 1 || !strings.Contains(r.stderr, "jetstream") || !strings.Contains(r.stderr, "operator.nk") || !strings.Contains(r.stderr, "fresh --data-dir") {
				t.Fatalf("%s beside a JetStream store and a seed: exit %d %s; want 1 naming both and what to do", verb, r.code, r.stderr)
			}
			seedKept(verb)
		}
		r := meshnode(t, nil, append([]string{"run"}, flags(dir)...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "damaged") || strings.Contains(r.stderr, "meshnode genesis") {
			t.Fatalf("run without a store beside a mesh's data: exit %d %s; want 1 saying the store is damaged", r.code, r.stderr)
		}
	})
	t.Run("SeedAlone", func(t *testing.T) {
		other := t.TempDir()
		if err := os.WriteFile(filepath.Join(other, "operator.nk"), seed, 0o600); err != nil {
			t.Fatal(err)
		}
		r := meshnode(t, nil, append([]string{"genesis"}, flags(other)...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "operator.nk") {
			t.Fatalf("genesis beside an operator seed: exit %d %s", r.code, r.stderr)
		}
	})
	t.Run("AfterAFailedRun", func(t *testing.T) {
		// run on an empty data dir leaves a store without a bucket: no mesh data.
		fresh := t.TempDir()
		if r := meshnode(t, nil, append([]string{"run"}, flags(fresh)...)...); r.code != 1 || !strings.Contains(r.stderr, "meshnode genesis") {
			t.Fatalf("run on an empty data dir: exit %d %s", r.code, r.stderr)
		}
		if r := meshnode(t, nil, append([]string{"genesis"}, flags(fresh)...)...); r.code != 0 {
			t.Fatalf("genesis after a failed run: exit %d %s", r.code, r.stderr)
		}
	})
}

// TestBinary_ModuleRegisterSeed: module register checks --creds-out before the mesh mints
// anything (a missing directory, an existing file), refuses a manifest over the size limit,
// and a lost seed is recovered with --rotate-key: a new key, written to a new file, and the
// old seed refused. Before, a --creds-out into a missing directory registered the module
// and lost its only seed.
func TestBinary_ModuleRegisterSeed(t *testing.T) {
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
