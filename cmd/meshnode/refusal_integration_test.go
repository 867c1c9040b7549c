//go:build integration

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestIntegration_Binary_AdminVerbsRefuseAModuleKey: an admin verb run with a module's seed fails at
// once, exit 1, naming the subject the bus refused and the operator's seed to use instead.
// Before, nats.go handed the server's refusal to the CLI's quiet error handler and the
// request waited out its 30 s timeout.
func TestIntegration_Binary_AdminVerbsRefuseAModuleKey(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	defer p.stop(t, syscall.SIGTERM)
	work := t.TempDir()
	manifestPath := filepath.Join(work, "shop.yaml")
	if err := os.WriteFile(manifestPath, []byte("module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(work, "shop.nk")
	if r := meshnode(t, nil, "module", "register", manifestPath, "--creds-out", seed, "--data-dir", dir); r.code != 0 {
		t.Fatalf("register: exit %d %s", r.code, r.stderr)
	}

	for _, tc := range []struct {
		args    []string
		subject string // what the refusal must name
	}{
		{[]string{"module", "ls"}, "mesh.seat.mesh-controller.tool.list"},
		{[]string{"seat", "ls"}, "mesh.seat.mesh-controller.tool.seats"},
		{[]string{"vault", "mint", "smtp"}, "mesh.seat.mesh-vault.tool."},
		{[]string{"token", "create"}, "mesh.seat.mesh-vault.tool."},
		{[]string{"dead", "ls"}, "$JS.API.STREAM.INFO.DEAD"},
		{[]string{"audit", "query"}, "mesh.node.alpha.tool.audit"},
		{[]string{"logs", "shop"}, "mesh.seat.mesh-controller.tool.ps"},
		{[]string{"logs", "shop", "--node", "alpha"}, "mesh.node.alpha.tool.logs"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			start := time.Now()
			r := meshnode(t, nil, append(tc.args, "--creds", seed, "--data-dir", dir)...)
			took := time.Since(start)
			if r.code != 1 {
				t.Fatalf("exit %d, want 1\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
			}
			if took > 5*time.Second {
				t.Errorf("took %s; a refusal must not wait for the request's timeout", took)
			}
			for _, want := range []string{"the key in " + seed + " may not publish to " + tc.subject, filepath.Join(dir, "operator.nk")} {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr %q does not say %q", r.stderr, want)
				}
			}
		})
	}

	// The operator's seed still works on the same node.
	if r := meshnode(t, nil, "module", "ls", "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, "shop") {
		t.Fatalf("module ls as the operator: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
}
