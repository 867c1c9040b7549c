package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/snapshot"
)

// TestSnapshotCmd: `snapshot save` of a node running in this process writes a file that
// `snapshot inspect` reads back with the mesh's streams, the operator's public key and no
// progress on a stderr that is no terminal; an existing file is kept unless --force; a
// damaged file is refused by inspect with exit 1 and the reason.
func TestSnapshotCmd(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MESHNODE_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	target, closeNode, err := openBenchNode(t.TempDir(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer closeNode()
	meshnode := func(args ...string) result {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		return result{code, stdout.String(), stderr.String()}
	}
	file := filepath.Join(t.TempDir(), "mesh.snap")
	save := []string{"snapshot", "save", file, "--server", target.URL, "--creds", target.OperatorSeed}

	// The node serves its tools a moment after it listens.
	var saved result
	retryUntil(t, 30*time.Second, func() error {
		if saved = meshnode(save...); saved.code != 0 {
			return fmt.Errorf("snapshot save: exit %d: %s", saved.code, saved.stderr)
		}
		return nil
	})
	if !strings.HasPrefix(saved.stdout, "saved mesh ") || saved.stderr != "" {
		t.Fatalf("snapshot save printed %q, and %q on stderr (no terminal: no progress)", saved.stdout, saved.stderr)
	}
	if again := meshnode(save...); again.code != exitFailed || !strings.Contains(again.stderr, "--force") {
		t.Fatalf("snapshot save onto an existing file: exit %d, %q; want 1 and --force named", again.code, again.stderr)
	}
	forced := meshnode(append(save, "--force", "--json")...)
	if forced.code != 0 {
		t.Fatalf("snapshot save --force: exit %d, %q", forced.code, forced.stderr)
	}
	checkJSON(t, "snapshot save", forced.stdout)

	inspected := meshnode("snapshot", "inspect", file)
	if inspected.code != 0 || !strings.Contains(inspected.stdout, "every checksum matches") || !strings.Contains(inspected.stdout, "KV_mesh-registry") {
		t.Fatalf("snapshot inspect: exit %d\n%s%s", inspected.code, inspected.stdout, inspected.stderr)
	}
	asJSON := meshnode("snapshot", "inspect", file, "--json")
	checkJSON(t, "snapshot inspect", asJSON.stdout)
	var man snapshot.Manifest
	if err := json.Unmarshal([]byte(asJSON.stdout), &man); err != nil || asJSON.code != 0 {
		t.Fatalf("snapshot inspect --json: exit %d, %v\n%s", asJSON.code, err, asJSON.stdout)
	}
	var names []string
	for _, s := range man.Streams {
		names = append(names, s.Name())
	}
	for _, want := range []string{"KV_mesh-registry", "KV_mesh-vault", "STATE", "EVENTS"} {
		if !slices.Contains(names, want) {
			t.Errorf("the snapshot's streams %v lack %s", names, want)
		}
	}
	if man.MeshID == "" || man.Operator != publicKeyOf(target.OperatorSeed) || man.Operator == "" || !strings.Contains(inspected.stdout, man.MeshID) {
		t.Errorf("the snapshot's mesh %q and operator %q (want %q)", man.MeshID, man.Operator, publicKeyOf(target.OperatorSeed))
	}

	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if bad := meshnode("snapshot", "inspect", file); bad.code != exitFailed || !strings.Contains(bad.stderr, "damaged") {
		t.Fatalf("snapshot inspect of a damaged file: exit %d, %q; want 1 and the damage named", bad.code, bad.stderr)
	}
}
