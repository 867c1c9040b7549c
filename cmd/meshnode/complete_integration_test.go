//go:build integration

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestIntegration_Binary_Completion: the shell completes module, seat, node and secret names from the
// running node (cobra's __complete, what `meshnode completion bash` calls).
func TestIntegration_Binary_Completion(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	defer p.stop(t, syscall.SIGTERM)
	shop := filepath.Join(t.TempDir(), "shop.yaml")
	os.WriteFile(shop, []byte("module: shop\nrequires: [mesh-bus]\nemits: [sold]\n"), 0o600)
	if r := meshnode(t, nil, "module", "register", shop, "--creds-out", filepath.Join(t.TempDir(), "s.nk"), "--data-dir", dir); r.code != 0 {
		t.Fatalf("register: %s", r.stderr)
	}
	if r := meshnode(t, nil, "vault", "mint", "api-token", "--data-dir", dir); r.code != 0 {
		t.Fatalf("vault mint: %s", r.stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"module", "remove", "--data-dir", dir, "sh"}, "shop"},
		{[]string{"seat", "pin", "--data-dir", dir, "shop", "mesh-c"}, "mesh-controller"},
		{[]string{"node", "remove", "--data-dir", dir, ""}, "alpha"},
		{[]string{"vault", "fetch", "--data-dir", dir, "api"}, "api-token"},
	} {
		r := meshnode(t, nil, append([]string{"__complete"}, tc.args...)...)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if r.code != 0 || len(lines) < 2 || lines[0] != tc.want || lines[len(lines)-1] != ":4" {
			t.Errorf("complete %v: exit %d %q, want %s first", tc.args, r.code, r.stdout, tc.want)
		}
	}
}
