//go:build integration

package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
)

// TestIntegration_Binary_RemoteStatusMembers: status, members and ui reach a node from a
// directory with no data dir — as from another machine, with a copy of the operator's seed —
// by --server/--creds, MESHNODE_SERVER/MESHNODE_CREDS and a server context, over the node's
// bus; a member's address is its client URL; a module's seed and a node that is not there
// are refused with what to do.
func TestIntegration_Binary_RemoteStatusMembers(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	defer p.stop(t, syscall.SIGTERM)
	elsewhere := t.TempDir() // the working directory: no ./meshnode-data, no node.json
	op := filepath.Join(elsewhere, "operator.nk")
	seed, err := os.ReadFile(filepath.Join(dir, "operator.nk"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(op, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	home := "XDG_CONFIG_HOME=" + t.TempDir()
	run := func(env []string, args ...string) result {
		t.Helper()
		return meshnodeIn(t, elsewhere, append([]string{home}, env...), args...)
	}
	byFlags := []string{"--server", p.clientURL, "--creds", op}
	byEnv := []string{envServer + "=" + p.clientURL, envCreds + "=" + op}

	var st api.NodeStatus
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{{"flags", nil, byFlags}, {"environment", byEnv, nil}} {
		r := run(tc.env, append([]string{"status", "--json"}, tc.args...)...)
		if r.code != 0 {
			t.Fatalf("status by %s: exit %d %s", tc.name, r.code, r.stderr)
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Name != "alpha" || st.MeshID != p.meshID || !st.Ready || st.ClientURL != p.clientURL {
			t.Fatalf("status by %s: %v %+v", tc.name, err, st)
		}
		r = run(tc.env, append([]string{"members", "--json"}, tc.args...)...)
		var m api.NodeMember
		if err := json.Unmarshal([]byte(r.stdout), &m); r.code != 0 || err != nil || m.Name != "alpha" || m.Address != p.clientURL || m.GossipAddr != "" || m.State != "alive" {
			t.Fatalf("members by %s: exit %d %v %q %s", tc.name, r.code, err, r.stdout, r.stderr)
		}
	}
	if r := run(byEnv, "members"); r.code != 0 || !strings.Contains(strings.SplitN(r.stdout, "\n", 2)[0], "CLIENT URL") || !strings.Contains(r.stdout, p.clientURL) {
		t.Fatalf("members' table: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r := run(nil, append([]string{"status"}, byFlags...)...); r.code != 0 || !strings.Contains(r.stdout, "alpha") || !strings.Contains(r.stdout, p.clientURL) {
		t.Fatalf("status' table: exit %d %q %s", r.code, r.stdout, r.stderr)
	}

	// A selected server context: status, members and ui need no flag.
	if r := run(nil, "context", "add", "remote", "--server", p.clientURL, "--creds", op, "--select"); r.code != 0 {
		t.Fatalf("context add: exit %d %s", r.code, r.stderr)
	}
	if r := run(nil, "status", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"name": "alpha"`) {
		t.Fatalf("status through the context: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := run(nil, "members", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"address":"`+p.clientURL+`"`) {
		t.Fatalf("members through the context: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	// ui: the challenge comes over the bus; the link logs a browser in, once.
	r := run(nil, "ui")
	link := strings.TrimSpace(r.stdout)
	if r.code != 0 || !strings.HasPrefix(link, p.httpURL+"/ui/login?") {
		t.Fatalf("ui through the context: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for i, want := range []int{http.StatusSeeOther, http.StatusForbidden} {
		resp, err := noRedirect.Get(link)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("login link, use %d: %s, want %d", i+1, resp.Status, want)
		}
	}
	if r := run(nil, "ui", "--read-only", "--http", "http://127.0.0.1:18222"); r.code != 0 || !strings.HasPrefix(r.stdout, "http://127.0.0.1:18222/ui/login?") || !strings.Contains(r.stdout, "mode=read-only") {
		t.Fatalf("ui --http (a tunnel's end): exit %d %q %s", r.code, r.stdout, r.stderr)
	}

	// Refusals: a module's seed, and no node at the address.
	shop := filepath.Join(elsewhere, "shop.yaml")
	os.WriteFile(shop, []byte("module: shop\nrequires: [mesh-bus]\n"), 0o600)
	shopSeed := filepath.Join(elsewhere, "shop.nk")
	if r := run(nil, "module", "register", shop, "--creds-out", shopSeed); r.code != 0 {
		t.Fatalf("register through the context: exit %d %s", r.code, r.stderr)
	}
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"status", "--server", p.clientURL, "--creds", shopSeed}, "admin verbs need the operator's seed"},
		{[]string{"members", "--server", p.clientURL, "--creds", shopSeed}, "admin verbs need the operator's seed"},
		{[]string{"status", "--server", "nats://127.0.0.1:1", "--creds", op}, "is the node running"},
	} {
		if r := run(nil, tc.args...); r.code != 1 || !strings.Contains(r.stderr, tc.stderr) {
			t.Errorf("%v: exit %d %s, want 1 and %q", tc.args, r.code, r.stderr, tc.stderr)
		}
	}
}
