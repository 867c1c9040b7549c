package main

import (
	"bufio"
	"encoding/json"
	"net"
	"os/exec"
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
	if r := meshnode(t, nil, append([]string{"join", "--token", "MNJ1.x"}, flags(nodeArgs{t.TempDir(), "d"})...)...); r.code != 1 || !strings.Contains(r.stderr, "not built yet") {
		t.Fatalf("join with a vault token: exit %d %s", r.code, r.stderr)
	}
}
