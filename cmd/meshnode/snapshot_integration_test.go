//go:build integration

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestIntegration_SnapshotSaveInspect: `snapshot save` of a running node (its binary, a
// module registered, a secret minted) writes a file `snapshot inspect` reads, holding the
// registry and the vault's bucket; read as a restore would, the file holds neither the
// secret's value nor any seed — the operator's, the module's — while it does hold the
// module's name.
func TestIntegration_SnapshotSaveInspect(t *testing.T) {
	dir := t.TempDir()
	startNode(t, "up", upArgs(dir, "alpha")...)
	seedFile := registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: [sold]\nsecrets: [api-key]\n")
	if r := meshnode(t, nil, "vault", "mint", "api-key", "--owner", "shop", "--data-dir", dir); r.code != 0 {
		t.Fatalf("vault mint: exit %d %s", r.code, r.stderr)
	}
	fetched := meshnode(t, nil, "vault", "fetch", "api-key", "--owner", "shop", "--data-dir", dir)
	secret := strings.TrimSpace(fetched.stdout)
	if fetched.code != 0 || len(secret) < 16 {
		t.Fatalf("vault fetch: exit %d %q %s", fetched.code, secret, fetched.stderr)
	}

	file := filepath.Join(t.TempDir(), "mesh.snap")
	saved := meshnode(t, nil, "snapshot", "save", file, "--data-dir", dir)
	if saved.code != 0 || !strings.HasPrefix(saved.stdout, "saved mesh ") {
		t.Fatalf("snapshot save: exit %d\n%s%s", saved.code, saved.stdout, saved.stderr)
	}
	inspected := meshnode(t, nil, "snapshot", "inspect", file)
	if inspected.code != 0 || !strings.Contains(inspected.stdout, "KV_mesh-registry") || !strings.Contains(inspected.stdout, "KV_mesh-vault") {
		t.Fatalf("snapshot inspect: exit %d\n%s%s", inspected.code, inspected.stdout, inspected.stderr)
	}

	text := testbed.SnapshotBytes(t, file)
	if !bytes.Contains(text, []byte("shop")) {
		t.Fatal("the unpacked file does not name the registered module: the scan reads it wrongly")
	}
	if bytes.Contains(text, []byte(secret)) {
		t.Error("the snapshot holds the secret's value in plaintext")
	}
	seeds := regexp.MustCompile(`S[OAUNCPX][A-Z2-7]{56}`).FindAll(text, -1)
	if len(seeds) > 0 {
		t.Errorf("the snapshot holds %d nkey seeds", len(seeds))
	}
	for _, f := range []string{seedFile, filepath.Join(dir, "operator.nk")} {
		seed, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(text, bytes.TrimSpace(seed)) {
			t.Errorf("the snapshot holds the seed of %s", f)
		}
	}
}
