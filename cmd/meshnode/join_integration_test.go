//go:build integration

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/config"
)

// TestIntegration_JoinNoRun: `join --no-run` prepares a machine for systemd and exits 0 —
// with a founding token (b and c, offline) and with a join token (d, enrolled by the formed
// mesh's vault) — leaving the data dir and its meshnode.yaml; each node is then started as the
// unit starts it, `run --data-dir DIR` alone, and all four are alive members of one mesh.
func TestIntegration_JoinNoRun(t *testing.T) {
	a, b, c := newMeshNode(t, "a"), newMeshNode(t, "b"), newMeshNode(t, "c")
	r := meshnode(t, nil, append([]string{"genesis", "--expect", "3", "--json"}, a.flags...)...)
	var g struct {
		MeshID        string `json:"mesh_id"`
		FoundingToken string `json:"founding_token"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &g); err != nil || r.code != 0 {
		t.Fatalf("genesis: exit %d %s %s (%v)", r.code, r.stdout, r.stderr, err)
	}
	joinNoRun := func(n *meshNode, token string) {
		t.Helper()
		tokenFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := meshnode(t, nil, append([]string{"join", "--no-run", "--token-file", tokenFile}, n.flags...)...)
		if r.code != 0 || !strings.Contains(r.stdout, "start the node with `systemctl enable --now meshnode`") {
			t.Fatalf("join --no-run %s: exit %d %s %s", n.name, r.code, r.stdout, r.stderr)
		}
		kept, err := os.ReadFile(filepath.Join(n.dir, config.FileName))
		if err != nil || !strings.Contains(string(kept), "gossip-addr: "+flagValue(n.flags, "--gossip-addr")) {
			t.Fatalf("join --no-run %s kept %q (%v), want its gossip address", n.name, kept, err)
		}
		// A second join on the data dir it prepared is refused: it holds a mesh now.
		if r := meshnode(t, nil, append([]string{"join", "--no-run", "--token-file", tokenFile}, n.flags...)...); r.code != 1 || !strings.Contains(r.stderr, "use `meshnode run`") {
			t.Fatalf("join --no-run again on %s: exit %d %s", n.name, r.code, r.stderr)
		}
	}
	joinNoRun(b, g.FoundingToken)
	joinNoRun(c, g.FoundingToken)

	// As the unit starts them: the data dir alone (its meshnode.yaml has the addresses).
	unit := func(n *meshNode) { n.p = launch(t, "run", "--data-dir", n.dir, "--log-level", logLevelForTests()) }
	for _, n := range []*meshNode{a, b, c} {
		unit(n)
	}
	for _, n := range []*meshNode{a, b, c} {
		n.p.awaitReady(t, 90*time.Second)
		if n.p.meshID != g.MeshID {
			t.Fatalf("node %s reports mesh %s, want %s", n.name, n.p.meshID, g.MeshID)
		}
	}

	// d enrols with a join token through the formed mesh, then exits; run, it is the fourth.
	r = meshnode(t, nil, "token", "create", "--json", "--data-dir", a.dir)
	var jt struct{ Token string }
	if json.Unmarshal([]byte(r.stdout), &jt); r.code != 0 || !strings.HasPrefix(jt.Token, "MNJ1.") {
		t.Fatalf("token create: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	d := newMeshNode(t, "d")
	joinNoRun(d, jt.Token)
	unit(d)
	d.p.awaitReady(t, 60*time.Second)
	retryUntil(t, 30*time.Second, func() error {
		st, err := memberStates(t, a.dir)
		if err != nil || len(st) != 4 || !strings.HasPrefix(st["d"], "alive") {
			return fmt.Errorf("members after d joined with --no-run and ran: %v %v", st, err)
		}
		return nil
	})
}
