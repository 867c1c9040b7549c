package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
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
