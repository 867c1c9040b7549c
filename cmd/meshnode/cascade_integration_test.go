//go:build integration

package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestIntegration_BuilderKilledMidBuild: kill -9 of the process running a build; its job is
// redelivered to the other builder (the work queue's ack wait) and the cascade completes.
func TestIntegration_BuilderKilledMidBuild(t *testing.T) {
	repo := testbed.NewGitRepo(t)
	nodes, _, _ := formThreeWith(t, func(i int) []string {
		if i == 0 {
			return []string{"--git-repos", "shop=" + repo.Bare, "--mesh-seats", "mesh-controller,mesh-vault"}
		}
		return []string{"--builder", "true", "--mesh-seats", ""} // the controller stays on a
	})
	a := nodes[0]
	op := filepath.Join(a.dir, "operator.nk")
	registerModule(t, a.dir, "module: slow\nbuild: {from: shop/slow, run: sh build.sh}\n", "--creds", op)
	repo.Push(map[string]string{"slow/build.sh": "#!/bin/sh\nsleep 5\necho built > \"$OUT\"\n"})
	if r := meshnode(t, nil, "git", "notify", "shop", "--data-dir", a.dir); r.code != 0 {
		t.Fatalf("git notify: exit %d %s", r.code, r.stderr)
	}

	builds := func() []map[string]any {
		r := meshnode(t, nil, "builds", "--json", "--data-dir", a.dir)
		checkJSON(t, "builds", r.stdout)
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var b map[string]any
			if json.Unmarshal([]byte(line), &b) == nil {
				out = append(out, b)
			}
		}
		return out
	}
	var holder string
	retryUntil(t, 60*time.Second, func() error {
		bs := builds()
		if len(bs) == 0 || bs[len(bs)-1]["status"] != "running" {
			return fmt.Errorf("builds %v", bs)
		}
		r := meshnode(t, nil, "seat", "ls", "--json", "--data-dir", a.dir)
		for _, line := range strings.Split(r.stdout, "\n") {
			var s map[string]any
			if json.Unmarshal([]byte(line), &s) == nil && s["seat"] == "mesh-build-machine" {
				holder, _ = s["holder_node"].(string)
			}
		}
		if holder == "" {
			return fmt.Errorf("no holder of mesh-build-machine: %s", r.stdout)
		}
		return nil
	})
	var killed *meshNode
	for _, n := range nodes[1:] {
		if n.name == holder {
			killed = n
		}
	}
	if killed == nil {
		t.Fatalf("the builder %q is not b or c", holder)
	}
	killed.p.stop(t, syscall.SIGKILL)
	retryUntil(t, 90*time.Second, func() error {
		bs := builds()
		if len(bs) == 0 || bs[len(bs)-1]["status"] != "built" {
			return fmt.Errorf("builds %v", bs)
		}
		return nil
	})
}
