package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestBinary_FoundThree: genesis --expect 3 and two `join --token` processes form one mesh;
// every node reports the same mesh and is ready.
func TestBinary_FoundThree(t *testing.T) {
	type nodeArgs struct{ dir, name string }
	nodes := []nodeArgs{{t.TempDir(), "a"}, {t.TempDir(), "b"}, {t.TempDir(), "c"}}
	flags := func(n nodeArgs) []string {
		return []string{"--data-dir", n.dir, "--name", n.name, "--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--cluster-addr", freePort(t), "--gossip-addr", "127.0.0.1:" + strings.Split(freePort(t), ":")[1], "--log-level", "error"}
	}
	aFlags := flags(nodes[0])
	r := meshnode(t, nil, append([]string{"genesis", "--expect", "3", "--json"}, aFlags...)...)
	if r.code != 0 {
		t.Fatalf("genesis: %s", r.stderr)
	}
	var g map[string]any
	json.Unmarshal([]byte(r.stdout), &g)
	token, _ := g["founding_token"].(string)
	if !strings.HasPrefix(token, "MNF1.") {
		t.Fatalf("no founding token: %s", r.stdout)
	}
	start := time.Now()
	cmds := []*exec.Cmd{exec.Command(binary, append([]string{"run"}, aFlags...)...)}
	for _, n := range nodes[1:] {
		cmds = append(cmds, exec.Command(binary, append([]string{"join", "--token", token}, flags(n)...)...))
	}
	ready := make(chan string, 3)
	for _, c := range cmds {
		c.Env = cleanEnv()
		out, _ := c.StdoutPipe()
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Signal(syscall.SIGTERM); c.Wait() })
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if m := readyRE.FindStringSubmatch(sc.Text()); m != nil {
					ready <- m[2]
				}
			}
		}()
	}
	meshes := map[string]int{}
	for range 3 {
		select {
		case mesh := <-ready:
			meshes[mesh]++
		case <-time.After(90 * time.Second):
			t.Fatalf("not all three nodes ready after 90s: %v", meshes)
		}
	}
	t.Logf("three processes formed a ready mesh in %s", time.Since(start))
	if meshes[g["mesh_id"].(string)] != 3 {
		t.Fatalf("nodes report meshes %v, want all %s", meshes, g["mesh_id"])
	}
	if r := meshnode(t, nil, "status", "--json", "--data-dir", nodes[1].dir); r.code != 0 || !strings.Contains(r.stdout, `"ready": true`) {
		t.Fatalf("status of a founding node: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = meshnode(t, nil, "members", "--json", "--data-dir", nodes[1].dir)
	if r.code != 0 || strings.Count(r.stdout, `"state":"alive"`) != 3 || strings.Count(r.stdout, `"jetstream":"leader"`) != 1 {
		t.Fatalf("members: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	// The founding token is spent once the mesh has formed.
	late := flags(nodeArgs{t.TempDir(), "late"})
	if r := meshnode(t, nil, append([]string{"join", "--token", token}, late...)...); r.code != 1 || !strings.Contains(r.stderr, "founding token is spent") {
		t.Fatalf("a fourth node with the founding token: exit %d %s", r.code, r.stderr)
	}

	// A fourth node joins the formed mesh with a join token and serves clients.
	r = meshnode(t, nil, "token", "create", "--json", "--data-dir", nodes[0].dir)
	var jt struct{ Token string }
	if json.Unmarshal([]byte(r.stdout), &jt); r.code != 0 || !strings.HasPrefix(jt.Token, "MNJ1.") {
		t.Fatalf("token create: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	d := nodeArgs{t.TempDir(), "d"}
	start = time.Now()
	startNode(t, "join", append([]string{"--token", jt.Token}, flags(d)...)...)
	t.Logf("a fourth node joined and was ready in %s", time.Since(start))
	retryUntil(t, 30*time.Second, func() error {
		r := meshnode(t, nil, "members", "--json", "--data-dir", d.dir)
		if r.code != 0 || strings.Count(r.stdout, `"state":"alive"`) != 4 || !strings.Contains(r.stdout, `"name":"d"`) {
			return fmt.Errorf("members from d: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		return nil
	})
	manifest := filepath.Join(t.TempDir(), "m.yaml")
	os.WriteFile(manifest, []byte("module: joined\nrequires: [mesh-bus]\nemits: [hello]\n"), 0o600)
	seed := filepath.Join(t.TempDir(), "joined.nk")
	if r := meshnode(t, nil, "module", "register", manifest, "--creds-out", seed, "--data-dir", d.dir, "--creds", nodes[0].dir+"/operator.nk"); r.code != 0 {
		t.Fatalf("register through the joined node: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	retryUntil(t, 20*time.Second, func() error {
		if r := meshnode(t, nil, "emit", "hello", `{"n":1}`, "--data-dir", d.dir, "--creds", seed); r.code != 0 {
			return fmt.Errorf("emit through the joined node: exit %d %s", r.code, r.stderr)
		}
		return nil
	})
	// The token was for one node; a second use and a taken name are refused, each saying so.
	if r := meshnode(t, nil, append([]string{"join", "--token", jt.Token}, flags(nodeArgs{t.TempDir(), "e"})...)...); r.code != 1 || !strings.Contains(r.stderr, "used up") {
		t.Fatalf("second use of a join token: exit %d %s", r.code, r.stderr)
	}
	r = meshnode(t, nil, "token", "create", "--json", "--data-dir", nodes[0].dir)
	json.Unmarshal([]byte(r.stdout), &jt)
	if r := meshnode(t, nil, append([]string{"join", "--token", jt.Token}, flags(nodeArgs{t.TempDir(), "b"})...)...); r.code != 1 || !strings.Contains(r.stderr, "has a server named b already") {
		t.Fatalf("join under a taken name: exit %d %s", r.code, r.stderr)
	}
}
