package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/recovery"
)

// TestGenesisFromSnapshot: a single node's snapshot, with the recovery key, is restored into
// a fresh data dir, in this process: the secret minted before is fetched with the same value
// by the operator's operator.nk from before (none is minted), and the restored node's audit
// log begins by naming the snapshot. Before that, every bad restore is refused before the
// data dir is written: a running mesh's data dir, a mesh's, no key, a mistyped key, another
// mesh's key, a file that is no snapshot.
func TestGenesisFromSnapshot(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MESHNODE_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	meshnode := func(args ...string) result {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		return result{code, stdout.String(), stderr.String()}
	}
	oldDir, keep := t.TempDir(), t.TempDir()
	target, closeNode, err := openBenchNode(oldDir, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if closeNode != nil {
			closeNode()
		}
	}()
	as := []string{"--server", target.URL, "--creds", target.OperatorSeed}
	retryUntil(t, 30*time.Second, func() error {
		if r := meshnode(append([]string{"vault", "mint", "db-password"}, as...)...); r.code != 0 {
			return fmt.Errorf("vault mint: exit %d: %s", r.code, r.stderr)
		}
		return nil
	})
	// The operator's fetch takes its credential from the environment: --creds would fetch as a module.
	fetch := func(url, creds string) result {
		t.Setenv(envServer, url)
		t.Setenv(envCreds, creds)
		defer os.Unsetenv(envServer)
		defer os.Unsetenv(envCreds)
		return meshnode("vault", "fetch", "db-password")
	}
	fetched := fetch(target.URL, target.OperatorSeed)
	rk := meshnode(append([]string{"vault", "recovery-key"}, as...)...)
	if fetched.code != 0 || rk.code != 0 || !strings.HasPrefix(rk.stdout, recovery.KeyPrefix) {
		t.Fatalf("vault fetch: exit %d %q; vault recovery-key: exit %d %q %q", fetched.code, fetched.stderr, rk.code, rk.stdout, rk.stderr)
	}
	keyFile := filepath.Join(keep, "recovery-key.txt")
	file := filepath.Join(keep, "mesh.snap")
	opSeed := filepath.Join(keep, "operator.nk")
	seed, err := os.ReadFile(target.OperatorSeed)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{keyFile: []byte(rk.stdout), opSeed: seed} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if r := meshnode(append([]string{"snapshot", "save", file}, as...)...); r.code != 0 {
		t.Fatalf("snapshot save: exit %d: %s", r.code, r.stderr)
	}
	if r := meshnode("snapshot", "inspect", file); r.code != 0 || !strings.Contains(r.stdout, "foundation  sealed under the barrier key") || !strings.Contains(r.stdout, "audit head  bench") {
		t.Fatalf("snapshot inspect: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	genesisArgs := func(dir, snap, key string) []string {
		return []string{"genesis", "--data-dir", dir, "--name", "bench", "--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--from-snapshot", snap, "--recovery-key-file", key}
	}
	// Into the running mesh's own data dir: refused, and why.
	if r := meshnode(genesisArgs(oldDir, file, keyFile)...); r.code != exitFailed || !strings.Contains(r.stderr, "in use by a running meshnode") {
		t.Fatalf("genesis --from-snapshot into a running node's data dir: exit %d, %q", r.code, r.stderr)
	}
	closeNode()
	closeNode = nil
	if r := meshnode(genesisArgs(oldDir, file, keyFile)...); r.code != exitFailed || !strings.Contains(r.stderr, "already belongs to a mesh") {
		t.Fatalf("genesis --from-snapshot into a mesh's data dir: exit %d, %q", r.code, r.stderr)
	}

	// Each refusal leaves the fresh data dir as it was: absent.
	fresh := filepath.Join(t.TempDir(), "fresh")
	typo := []byte(rk.stdout)
	i := len(recovery.KeyPrefix) + 3
	typo[i] = map[bool]byte{true: 'B', false: 'A'}[typo[i] == 'A']
	otherKey := make([]byte, 32)
	rand.Read(otherKey)
	notSnapshot := filepath.Join(keep, "not.snap")
	for name, b := range map[string][]byte{filepath.Join(keep, "typo.txt"): typo, filepath.Join(keep, "other.txt"): []byte(recovery.EncodeKey(otherKey)), notSnapshot: []byte("not a tar archive")} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		what string
		args []string
		code int
		says string
	}{
		{"no recovery key", genesisArgs(fresh, file, "")[:len(genesisArgs(fresh, file, ""))-2], exitUsage, "--recovery-key-file"},
		{"a mistyped key", genesisArgs(fresh, file, filepath.Join(keep, "typo.txt")), exitFailed, "mistyped"},
		{"another mesh's key", genesisArgs(fresh, file, filepath.Join(keep, "other.txt")), exitFailed, "not the one this snapshot's foundation was sealed under"},
		{"a file that is no snapshot", genesisArgs(fresh, notSnapshot, keyFile), exitFailed, "is not a meshnode snapshot"},
	} {
		if r := meshnode(c.args...); r.code != c.code || !strings.Contains(r.stderr, c.says) {
			t.Errorf("genesis --from-snapshot with %s: exit %d, %q; want %d and %q", c.what, r.code, r.stderr, c.code, c.says)
		}
		if _, err := os.Stat(fresh); !os.IsNotExist(err) {
			t.Fatalf("genesis --from-snapshot with %s wrote the data dir (%v)", c.what, err)
		}
	}

	// The restore, then the restored node.
	if r := meshnode(genesisArgs(fresh, file, keyFile)...); r.code != 0 || !strings.Contains(r.stdout, "restored from") {
		t.Fatalf("genesis --from-snapshot: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(fresh, "operator.nk")); !os.IsNotExist(err) {
		t.Errorf("genesis --from-snapshot minted an operator credential (%v): the old one is the mesh's", err)
	}
	restored, closeRestored, err := openBenchNode(fresh, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRestored()
	as = []string{"--server", restored.URL, "--creds", opSeed}
	var got result
	retryUntil(t, 30*time.Second, func() error {
		if got = fetch(restored.URL, opSeed); got.code != 0 {
			return fmt.Errorf("vault fetch from the restored mesh: exit %d: %s", got.code, got.stderr)
		}
		return nil
	})
	if got.stdout != fetched.stdout {
		t.Errorf("the restored secret is %q, want %q", got.stdout, fetched.stdout)
	}
	v := meshnode(append([]string{"audit", "verify"}, as...)...)
	if v.code != 0 || !strings.Contains(v.stdout, "restored here: record 1 names snapshot") || !strings.Contains(v.stdout, "node bench's log then ended at record") {
		t.Errorf("audit verify on the restored node: exit %d\n%s%s", v.code, v.stdout, v.stderr)
	}
	barrier, err := recovery.ParseKey(rk.stdout)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(file); err != nil || bytes.Contains(b, []byte(strings.TrimSpace(rk.stdout))) || bytes.Contains(b, barrier) {
		t.Errorf("the snapshot file holds the recovery key or the barrier key, or is gone (%v)", err)
	}
}
