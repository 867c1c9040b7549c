//go:build integration

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestIntegration_RestoreSingleNode: a node with modules registered, a module's secret, 100
// jobs queued at a seat with no holder, 10,000 events and a module deployed from an artifact
// is saved to a snapshot with its recovery key, stopped, and its data dir deleted. genesis
// --from-snapshot into a fresh data dir brings the mesh back: the operator's old operator.nk
// administers it, the module fetches its secret (the same value) with its original seed,
// the deployment runs again, the seat's holder connects with its original seed and handles
// every queued job, the artifact is there, and `audit verify` passes and shows where the log
// was restored. Restoring into the running node's data dir is refused, with the reason.
func TestIntegration_RestoreSingleNode(t *testing.T) {
	dir, keep := t.TempDir(), t.TempDir()
	old := startNode(t, "up", upArgs(dir, "alpha")...)
	mailer := registerModule(t, dir, "module: mailer\nrequires: [mesh-bus]\nseats:\n  mail: {scope: mesh, retain: 1d, accepts: [send]}\n")
	shop := registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: [sold]\nuses: [mail]\nsecrets: [api-key]\n")
	if r := meshnode(t, nil, "vault", "mint", "api-key", "--owner", "shop", "--data-dir", dir); r.code != 0 {
		t.Fatalf("vault mint: exit %d %s", r.code, r.stderr)
	}
	secret := meshnode(t, nil, "vault", "fetch", "api-key", "--creds", shop, "--server", old.clientURL)
	if secret.code != 0 || len(strings.TrimSpace(secret.stdout)) < 16 {
		t.Fatalf("vault fetch as shop: exit %d %q %s", secret.code, secret.stdout, secret.stderr)
	}
	loader := exec.Command(os.Args[0])
	loader.Env = append(cleanEnv(), "MESHNODE_TEST_LOADER="+old.clientURL, "MESHNODE_TEST_LOADER_SEED="+shop)
	if out, err := loader.CombinedOutput(); err != nil || !strings.Contains(string(out), "loaded") {
		t.Fatalf("load the mesh: %v\n%s", err, out)
	}
	// A module deployed from an artifact: its process runs again after the restore.
	registerModule(t, dir, "module: runner\nrequires: [mesh-bus]\n")
	script := filepath.Join(keep, "runner.sh")
	os.WriteFile(script, []byte("#!/bin/sh\necho \"hello from $MESH_NODE\"\nexec sleep 600\n"), 0o755)
	if r := meshnode(t, nil, "artifact", "put", "runner", script, "--version", "1.0.0", "--data-dir", dir); r.code != 0 {
		t.Fatalf("artifact put: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, "deploy", "runner", "--version", "1.0.0", "--all", "--wait", "30s", "--data-dir", dir); r.code != 0 {
		t.Fatalf("deploy: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// What the operator keeps: the recovery key and operator.nk, apart from the snapshot.
	rk := meshnode(t, nil, "vault", "recovery-key", "--data-dir", dir)
	keyFile, op, file := filepath.Join(keep, "recovery-key.txt"), filepath.Join(keep, "operator.nk"), filepath.Join(keep, "mesh.snap")
	seed, err := os.ReadFile(filepath.Join(dir, "operator.nk"))
	if rk.code != 0 || err != nil {
		t.Fatalf("vault recovery-key: exit %d %s (%v)", rk.code, rk.stderr, err)
	}
	os.WriteFile(keyFile, []byte(rk.stdout), 0o600)
	os.WriteFile(op, seed, 0o600)
	if r := meshnode(t, nil, "snapshot", "save", file, "--data-dir", dir); r.code != 0 {
		t.Fatalf("snapshot save: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if code, _ := old.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("the node exited %d on SIGTERM:\n%s", code, old.stderr)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}

	fresh := t.TempDir()
	restore := append([]string{"genesis", "--from-snapshot", file, "--recovery-key-file", keyFile}, upArgs(fresh, "alpha")...)
	if r := meshnode(t, nil, restore...); r.code != 0 || !strings.Contains(r.stdout, "restored from") {
		t.Fatalf("genesis --from-snapshot: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	restored := startNode(t, "run", upArgs(fresh, "alpha")...)
	if r := meshnode(t, nil, restore...); r.code != exitFailed || !strings.Contains(r.stderr, "in use by a running meshnode") {
		t.Fatalf("genesis --from-snapshot into the running mesh: exit %d %s", r.code, r.stderr)
	}
	as := []string{"--server", restored.clientURL, "--creds", op}
	var got result
	retryUntil(t, time.Minute, func() error {
		if got = meshnode(t, nil, "vault", "fetch", "api-key", "--creds", shop, "--server", restored.clientURL); got.code != 0 {
			return fmt.Errorf("vault fetch as shop, restored: exit %d %s", got.code, got.stderr)
		}
		return nil
	})
	if got.stdout != secret.stdout {
		t.Errorf("shop's secret after the restore is %q, want %q", got.stdout, secret.stdout)
	}
	if r := meshnode(t, nil, append([]string{"artifact", "ls", "--json"}, as...)...); r.code != 0 || !strings.Contains(r.stdout, `"1.0.0"`) {
		t.Errorf("artifact ls after the restore: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	retryUntil(t, time.Minute, func() error {
		r := meshnode(t, nil, append([]string{"ps", "--json"}, as...)...)
		var p struct{ Module, Node, State string }
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &p) != nil || p.Module != "runner" || p.State != "running" {
			return fmt.Errorf("ps after the restore: exit %d %s%s", r.code, r.stdout, r.stderr)
		}
		return nil
	})
	if r := meshnode(t, nil, append([]string{"seat", "ls", "--json"}, as...)...); !strings.Contains(r.stdout, fmt.Sprintf(`"backlog":%d`, loaderJobs)) {
		t.Fatalf("seat mail after the restore: want %d jobs queued: %s %s", loaderJobs, r.stdout, r.stderr)
	}
	gate := filepath.Join(t.TempDir(), "gate")
	os.WriteFile(gate, nil, 0o600)
	holderOut := &testbed.SyncBuffer{}
	holder := exec.Command(os.Args[0])
	holder.Env = append(cleanEnv(), "MESHNODE_TEST_HOLDER="+restored.clientURL, "MESHNODE_TEST_HOLDER_SEED="+mailer, "MESHNODE_TEST_HOLDER_GATE="+gate)
	holder.Stdout, holder.Stderr = holderOut, holderOut
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	retryUntil(t, time.Minute, func() error {
		for i := range loaderJobs {
			if !strings.Contains(holderOut.String(), fmt.Sprintf("job %d\n", i)) {
				return fmt.Errorf("job %d not handled: %s", i, holderOut)
			}
		}
		return nil
	})
	v := meshnode(t, nil, append([]string{"audit", "verify", "--json"}, as...)...)
	var ver struct {
		Records  uint64 `json:"records"`
		Restored *struct {
			Snapshot string `json:"snapshot"`
			Heads    map[string]struct{ N uint64 }
		} `json:"restored"`
	}
	if err := json.Unmarshal([]byte(v.stdout), &ver); err != nil || v.code != 0 || ver.Restored == nil || ver.Restored.Heads["alpha"].N == 0 {
		t.Fatalf("audit verify after the restore: exit %d %v\n%s%s", v.code, err, v.stdout, v.stderr)
	}
	if r := meshnode(t, nil, append([]string{"audit", "verify"}, as...)...); !strings.Contains(r.stdout, "restored here: record 1 names snapshot "+ver.Restored.Snapshot) {
		t.Errorf("audit verify does not show the restore:\n%s%s", r.stdout, r.stderr)
	}
}

// TestIntegration_RestoreMeshOfThree: a mesh of three processes with a module's secret and
// 100 jobs queued at a seat is saved, stopped and every data dir deleted; three fresh
// servers are founded again from the snapshot (genesis --expect 3 --from-snapshot on one,
// the founding token on the others, who wait for its restore). The module fetches the same
// secret through another server, the seat's holder handles every queued job, and every
// node's audit log verifies and begins by naming the snapshot.
func TestIntegration_RestoreMeshOfThree(t *testing.T) {
	nodes, meshID, _ := formMesh(t, 3, nil)
	a, keep := nodes[0], t.TempDir()
	mailer := registerModule(t, a.dir, "module: mailer\nrequires: [mesh-bus]\nseats:\n  mail: {scope: mesh, retain: 1d, accepts: [send]}\n")
	shop := registerModule(t, a.dir, "module: shop\nrequires: [mesh-bus]\nemits: [sold]\nuses: [mail]\nsecrets: [api-key]\n")
	if r := meshnode(t, nil, "vault", "mint", "api-key", "--owner", "shop", "--data-dir", a.dir); r.code != 0 {
		t.Fatalf("vault mint: exit %d %s", r.code, r.stderr)
	}
	secret := meshnode(t, nil, "vault", "fetch", "api-key", "--creds", shop, "--server", a.p.clientURL)
	if secret.code != 0 {
		t.Fatalf("vault fetch as shop: exit %d %s", secret.code, secret.stderr)
	}
	loading := time.Now()
	loader := exec.Command(os.Args[0])
	loader.Env = append(cleanEnv(), "MESHNODE_TEST_LOADER="+a.p.clientURL, "MESHNODE_TEST_LOADER_SEED="+shop)
	if out, err := loader.CombinedOutput(); err != nil || !strings.Contains(string(out), "loaded") {
		t.Fatalf("load the mesh: %v\n%s", err, out)
	}
	t.Logf("loaded %d events and %d jobs in %s", loaderEvents, loaderJobs, time.Since(loading))
	rk := meshnode(t, nil, "vault", "recovery-key", "--data-dir", a.dir)
	keyFile, op, file := filepath.Join(keep, "recovery-key.txt"), filepath.Join(keep, "operator.nk"), filepath.Join(keep, "mesh.snap")
	seed, err := os.ReadFile(filepath.Join(a.dir, "operator.nk"))
	if rk.code != 0 || err != nil {
		t.Fatalf("vault recovery-key: exit %d %s (%v)", rk.code, rk.stderr, err)
	}
	os.WriteFile(keyFile, []byte(rk.stdout), 0o600)
	os.WriteFile(op, seed, 0o600)
	if r := meshnode(t, nil, "snapshot", "save", file, "--data-dir", a.dir); r.code != 0 {
		t.Fatalf("snapshot save: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, n := range nodes {
		n.p.stop(t, syscall.SIGKILL) // every server lost at once
		os.RemoveAll(n.dir)
	}

	fresh := make([]*meshNode, 3)
	for i := range fresh {
		fresh[i] = newMeshNode(t, string(rune('a'+i)))
	}
	r := meshnode(t, nil, append([]string{"genesis", "--expect", "3", "--json", "--from-snapshot", file, "--recovery-key-file", keyFile}, fresh[0].flags...)...)
	var g struct {
		MeshID string `json:"mesh_id"`
		Token  string `json:"founding_token"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &g) != nil || g.MeshID != meshID || g.Token == "" {
		t.Fatalf("genesis --expect 3 --from-snapshot: exit %d, want mesh %s and a founding token\n%s%s", r.code, meshID, r.stdout, r.stderr)
	}
	restoring := time.Now()
	launchFounders(t, fresh, g.Token)
	for _, n := range fresh {
		n.p.awaitReady(t, 3*time.Minute)
	}
	t.Logf("three fresh servers restored the snapshot and were ready in %s", time.Since(restoring))
	var got result
	retryUntil(t, time.Minute, func() error {
		if got = meshnode(t, nil, "vault", "fetch", "api-key", "--creds", shop, "--server", fresh[1].p.clientURL); got.code != 0 {
			return fmt.Errorf("vault fetch as shop through b, restored: exit %d %s", got.code, got.stderr)
		}
		return nil
	})
	if got.stdout != secret.stdout {
		t.Errorf("shop's secret after the restore is %q, want %q", got.stdout, secret.stdout)
	}
	gate := filepath.Join(t.TempDir(), "gate")
	os.WriteFile(gate, nil, 0o600)
	holderOut := &testbed.SyncBuffer{}
	holder := exec.Command(os.Args[0])
	holder.Env = append(cleanEnv(), "MESHNODE_TEST_HOLDER="+fresh[2].p.clientURL, "MESHNODE_TEST_HOLDER_SEED="+mailer, "MESHNODE_TEST_HOLDER_GATE="+gate)
	holder.Stdout, holder.Stderr = holderOut, holderOut
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	retryUntil(t, 2*time.Minute, func() error {
		for i := range loaderJobs {
			if !strings.Contains(holderOut.String(), fmt.Sprintf("job %d\n", i)) {
				return fmt.Errorf("job %d not handled: %s", i, holderOut)
			}
		}
		return nil
	})
	var snapshotSum string
	for _, n := range fresh {
		v := meshnode(t, nil, "audit", "verify", "--json", "--server", n.p.clientURL, "--creds", op)
		var ver struct {
			Restored *struct{ Snapshot string } `json:"restored"`
		}
		if err := json.Unmarshal([]byte(v.stdout), &ver); err != nil || v.code != 0 || ver.Restored == nil {
			t.Fatalf("audit verify on %s after the restore: exit %d %v\n%s%s", n.name, v.code, err, v.stdout, v.stderr)
		}
		if snapshotSum == "" {
			snapshotSum = ver.Restored.Snapshot
		}
		if ver.Restored.Snapshot != snapshotSum {
			t.Errorf("%s's log names snapshot %s, a's %s", n.name, ver.Restored.Snapshot, snapshotSum)
		}
	}
}
