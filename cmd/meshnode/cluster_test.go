package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/internal/testbed"
)

// meshNode is one node of a test mesh: its data dir, name, flags (fixed ports, so a restart
// comes back on the same addresses) and process.
type meshNode struct {
	dir, name string
	flags     []string
	p         *process
}

func newMeshNode(t *testing.T, name string) *meshNode {
	dir := t.TempDir()
	return &meshNode{dir: dir, name: name, flags: []string{"--data-dir", dir, "--name", name,
		"--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--cluster-addr", testbed.FreeAddr(t), "--gossip-addr", testbed.FreeAddr(t), "--log-level", logLevelForTests()}}
}

// auditIDs returns how often each event of source is in the audit log of the node on dir.
func auditIDs(t *testing.T, dir, creds, source string) map[string]int {
	t.Helper()
	ids, err := queryAuditIDs(t, dir, creds, source)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// queryAuditIDs is auditIDs for a poll: a node that does not answer yet (it restarted, or
// its network came back a moment ago) is an error to try again, not a failure.
func queryAuditIDs(t *testing.T, dir, creds, source string) (map[string]int, error) {
	r := meshnode(t, nil, "audit", "query", "--source", source, "--json", "--data-dir", dir, "--creds", creds)
	if r.code != 0 {
		return nil, fmt.Errorf("audit query on %s: exit %d %s", dir, r.code, r.stderr)
	}
	ids := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		ids[rec.EventID]++
	}
	return ids, nil
}

// TestBinary_FormationProgress: a founding node waiting for the others says so in `status`
// (and exits 1, not ready) and on its HTTP address from the start — /healthz 200, /readyz
// 503 with the reason, answered while it waits — and stops promptly on SIGTERM.
func TestBinary_FormationProgress(t *testing.T) {
	a := newMeshNode(t, "a")
	httpAddr := testbed.FreeAddr(t)
	a.flags = append(a.flags, "--http-addr", httpAddr)
	if r := meshnode(t, nil, append([]string{"genesis", "--expect", "3"}, a.flags...)...); r.code != 0 {
		t.Fatalf("genesis: %s", r.stderr)
	}
	// systemd's notify socket: the node says why it is not ready yet, and extends its start.
	sock := filepath.Join(t.TempDir(), "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	cmd := exec.Command(binary, append([]string{"run"}, a.flags...)...)
	cmd.Env = append(cleanEnv(), "NOTIFY_SOCKET="+sock)
	a.p = launchCmd(t, cmd, "run")
	notify.SetReadDeadline(time.Now().Add(20 * time.Second))
	for buf := make([]byte, 4096); ; {
		n, err := notify.Read(buf)
		if err != nil {
			t.Fatalf("no STATUS of the formation on the notify socket: %v", err)
		}
		if msg := string(buf[:n]); strings.Contains(msg, "STATUS=waiting for 2 more node(s)") && strings.Contains(msg, "EXTEND_TIMEOUT_USEC=300000000") {
			break
		}
	}
	retryUntil(t, 20*time.Second, func() error {
		r := meshnode(t, nil, "status", "--data-dir", a.dir)
		if r.code != 1 || !strings.Contains(r.stderr, "is not ready: forming the mesh: waiting for 2 more node(s)") || !strings.Contains(r.stdout, "have a") {
			return fmt.Errorf("status while forming: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		return nil
	})
	// Answered while forming, not held until the mesh forms (how fast is a benchmark's
	// business, not a test's).
	quick := &http.Client{Timeout: 2 * time.Second}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503} {
		resp, err := quick.Get("http://" + httpAddr + path)
		if err != nil {
			t.Fatalf("%s while forming: %v", path, err)
		}
		var body struct{ Reason string }
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == 503 && (!strings.Contains(body.Reason, "waiting for 2 more node(s)") || !strings.Contains(body.Reason, "have a"))) {
			t.Fatalf("%s while forming: %d %q", path, resp.StatusCode, body.Reason)
		}
	}
	if code, took := a.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("stop while forming: exit %d after %s\n%s", code, took, a.p.stderr)
	}
	if r := meshnode(t, nil, "status", "--data-dir", a.dir); r.code != 1 || !strings.Contains(r.stderr, "no meshnode is running") {
		t.Fatalf("status after the stop: exit %d %s", r.code, r.stderr)
	}

	// genesis kept the addresses it was given beside the data dir, so the unit's command —
	// run with the data dir alone — starts the same server: the same HTTP address answers,
	// still waiting for the same peers.
	kept, err := os.ReadFile(filepath.Join(a.dir, "meshnode.yaml"))
	if st, _ := os.Stat(filepath.Join(a.dir, "meshnode.yaml")); err != nil || st.Mode().Perm() != 0o600 ||
		!strings.Contains(string(kept), "cluster-addr: "+flagValue(a.flags, "--cluster-addr")) || !strings.Contains(string(kept), "http-addr: "+httpAddr) {
		t.Fatalf("meshnode.yaml after genesis: %v\n%s", err, kept)
	}
	a.p = launch(t, "run", "--data-dir", a.dir, "--log-level", "error")
	retryUntil(t, 20*time.Second, func() error {
		resp, err := quick.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return err
		}
		var body struct{ Reason string }
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != 503 || !strings.Contains(body.Reason, "waiting for 2 more node(s)") {
			return fmt.Errorf("/readyz of run --data-dir alone: %d %q", resp.StatusCode, body.Reason)
		}
		return nil
	})
	a.p.stop(t, syscall.SIGTERM)
}

// logLevelForTests is the log level of a test mesh's nodes: debug with MESHNODE_TEST_LOG set
// (a stop that takes too long, say), else errors only.
func logLevelForTests() string {
	if os.Getenv("MESHNODE_TEST_LOG") != "" {
		return "debug"
	}
	return "error"
}

// TestBinary_JoinToken: join takes its token from a file, the environment or (with a warning,
// since ps shows it) the command line — one of them; none, or two, is a usage error.
func TestBinary_JoinToken(t *testing.T) {
	dir := t.TempDir()
	flags := []string{"--data-dir", dir, "--name", "z"}
	file := filepath.Join(t.TempDir(), "token")
	os.WriteFile(file, []byte("MNJ1.not-a-token\n"), 0o600)
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	for _, tc := range []struct {
		name    string
		env     []string
		args    []string
		code    int
		stderr  string
		warning bool
	}{
		{"none", nil, nil, 2, "a token is required: --token-file FILE or MESHNODE_TOKEN", false},
		{"two", nil, []string{"--token", "MNJ1.x", "--token-file", file}, 2, "--token and --token-file are given", false},
		{"env and file", []string{"MESHNODE_TOKEN=MNJ1.x"}, []string{"--token-file", file}, 2, "--token-file and MESHNODE_TOKEN are given", false},
		{"missing file", nil, []string{"--token-file", filepath.Join(dir, "nope")}, 1, "read the token", false},
		{"empty file", nil, []string{"--token-file", empty}, 1, "is empty", false},
		{"file", nil, []string{"--token-file", file}, 1, "token", false},
		{"env", []string{"MESHNODE_TOKEN=MNJ1.not-a-token"}, nil, 1, "token", false},
		{"command line", nil, []string{"--token", "MNJ1.not-a-token"}, 1, "token", true},
	} {
		r := meshnode(t, tc.env, append(append([]string{"join"}, tc.args...), flags...)...)
		warned := strings.Contains(r.stderr, "visible to every user of this machine (ps)")
		if r.code != tc.code || !strings.Contains(r.stderr, tc.stderr) || warned != tc.warning {
			t.Errorf("%s: exit %d, warned %v: %s", tc.name, r.code, warned, r.stderr)
		}
	}
}

// TestBinary_RunTakesTheDataDirsName: `run` without --name (the unit's way) is the node its
// data dir holds, whatever the host is called; a --name that disagrees is refused, saying so.
func TestBinary_RunTakesTheDataDirsName(t *testing.T) {
	dir := t.TempDir()
	addrs := []string{"--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--cluster-addr", testbed.FreeAddr(t), "--gossip-addr", testbed.FreeAddr(t)}
	if r := meshnode(t, nil, append([]string{"genesis", "--data-dir", dir, "--name", "first-node"}, addrs...)...); r.code != 0 {
		t.Fatalf("genesis: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"run", "--data-dir", dir, "--name", "other"}, addrs...)...); r.code != 1 || !strings.Contains(r.stderr, `holds node "first-node", not "other"`) {
		t.Fatalf("run with another --name: exit %d %s", r.code, r.stderr)
	}
	p := startNode(t, "run", append([]string{"--data-dir", dir}, addrs...)...)
	r := meshnode(t, nil, "status", "--json", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, `"name": "first-node"`) {
		t.Fatalf("status of a node run without --name: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	p.stop(t, syscall.SIGTERM)
	// Its log names it too: every line, not the host's default name it started with.
	if out := p.stderr.String(); !strings.Contains(out, "node=first-node") || strings.Contains(out, "node="+config.DefaultName()+" ") {
		t.Fatalf("the log of a node run without --name does not name it first-node throughout:\n%s", out)
	}
}

// TestBinary_Advertise: a founding node whose cluster address binds every interface is
// refused until --advertise says which address reaches it; one that would advertise
// loopback to peers elsewhere is refused too.
func TestBinary_Advertise(t *testing.T) {
	a := newMeshNode(t, "a")
	cluster := testbed.FreeAddr(t)
	_, port, _ := net.SplitHostPort(cluster)
	a.flags = append(a.flags, "--cluster-addr", "0.0.0.0:"+port)
	if r := meshnode(t, nil, append([]string{"genesis", "--expect", "3"}, a.flags...)...); r.code != 0 {
		t.Fatalf("genesis: %s", r.stderr)
	}
	r := meshnode(t, nil, append([]string{"run"}, a.flags...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "cluster-addr 0.0.0.0:"+port+" binds every interface") || !strings.Contains(r.stderr, "--advertise") {
		t.Fatalf("run binding 0.0.0.0 without --advertise: exit %d %s", r.code, r.stderr)
	}
	a.p = launch(t, "run", append(a.flags, "--advertise", "127.0.0.1")...)
	retryUntil(t, 20*time.Second, func() error {
		if r := meshnode(t, nil, "status", "--data-dir", a.dir); !strings.Contains(r.stdout+r.stderr, "waiting for 2 more node(s)") {
			return fmt.Errorf("status with --advertise: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		return nil
	})
	a.p.stop(t, syscall.SIGTERM)
	if r := meshnode(t, nil, "run", "--advertise", "0.0.0.0", "--data-dir", a.dir); r.code != 2 || !strings.Contains(r.stderr, "advertise") {
		t.Fatalf("--advertise 0.0.0.0: exit %d %s", r.code, r.stderr)
	}
}

// flagValue is the value after name in flags ("" if absent).
func flagValue(flags []string, name string) string {
	for i, f := range flags {
		if f == name && i+1 < len(flags) {
			return flags[i+1]
		}
	}
	return ""
}
