package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

// flagValue is the value after name in flags ("" if absent).
func flagValue(flags []string, name string) string {
	for i, f := range flags {
		if f == name && i+1 < len(flags) {
			return flags[i+1]
		}
	}
	return ""
}
