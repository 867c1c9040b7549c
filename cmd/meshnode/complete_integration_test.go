//go:build integration

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestIntegration_Binary_Completion: the shell completes module, seat, node, secret and version names
// from the running node, found by data dir or by server (cobra's __complete, what `meshnode
// completion bash` calls); a comma-separated --nodes completes its last name.
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
	bin := filepath.Join(t.TempDir(), "shop")
	os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o700)
	if r := meshnode(t, nil, "artifact", "put", "shop", bin, "--version", "1.2.0", "--data-dir", dir); r.code != 0 {
		t.Fatalf("artifact put: %s", r.stderr)
	}
	remote := []string{"--server", p.clientURL, "--creds", filepath.Join(dir, "operator.nk")}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"module", "remove", "--data-dir", dir, "sh"}, "shop"},
		{[]string{"call", "--data-dir", dir, "mesh-con"}, "mesh-controller"},
		{[]string{"deploy", "--data-dir", dir, "shop", "--nodes", "al"}, "alpha"},
		{[]string{"deploy", "--data-dir", dir, "shop", "--version", ""}, "1.2.0"},
		{[]string{"logs", "--data-dir", dir, "shop", "--node", ""}, "alpha"},
		{append(append([]string{"node", "remove"}, remote...), ""), "alpha"}, // by server: over the bus
		{append(append([]string{"undeploy", "shop"}, remote...), "--nodes", "x,"), "x,alpha"},
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
