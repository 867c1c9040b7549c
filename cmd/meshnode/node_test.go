package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/formats"
)

// loopback are the flags that put a node on free loopback ports.
var loopback = []string{"--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}

func upArgs(dir, name string) []string {
	return append([]string{"--data-dir", dir, "--name", name}, loopback...)
}

// TestBinary_BadInput checks each bad input exits with the right code and a message naming
// what to change.
func TestBinary_BadInput(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)

	corrupt := t.TempDir()
	os.WriteFile(filepath.Join(corrupt, "meshnode.db"), []byte(strings.Repeat("garbage ", 2000)), 0o600)

	unknownKey := t.TempDir()
	os.WriteFile(filepath.Join(unknownKey, "meshnode.yaml"), []byte("name: alpha\nclient-adr: 127.0.0.1:1\n"), 0o600)

	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		code  int
		wants []string
	}{
		{"ClientAddrInUse", nil, []string{"up", "--data-dir", t.TempDir(), "--client-addr", taken.Addr().String(), "--http-addr", "127.0.0.1:0"},
			1, []string{taken.Addr().String(), "--client-addr"}},
		{"HTTPAddrInUse", nil, []string{"up", "--data-dir", t.TempDir(), "--client-addr", "127.0.0.1:0", "--http-addr", taken.Addr().String()},
			1, []string{taken.Addr().String(), "--http-addr"}},
		{"UnknownConfigKey", nil, []string{"up", "--data-dir", unknownKey},
			2, []string{"client-adr", "line 2"}},
		{"UnknownConfigFile", nil, []string{"up", "--config", filepath.Join(t.TempDir(), "nope.yaml")},
			2, []string{"nope.yaml"}},
		{"BadDurationFlag", nil, []string{"up", "--data-dir", t.TempDir(), "--shutdown-timeout", "soon"},
			2, []string{"shutdown-timeout", `"soon"`}},
		{"BadDurationEnv", []string{"MESHNODE_EVENTS_MAX_AGE=forever"}, []string{"up", "--data-dir", t.TempDir()},
			2, []string{"MESHNODE_EVENTS_MAX_AGE", `"forever"`}},
		{"UnknownEnv", []string{"MESHNODE_NAEM=x"}, []string{"up", "--data-dir", t.TempDir()},
			2, []string{"MESHNODE_NAEM"}},
		{"BadAddress", nil, []string{"up", "--data-dir", t.TempDir(), "--client-addr", "localhost"},
			2, []string{"client-addr", `"localhost"`, "host:port"}},
		{"BadName", nil, []string{"up", "--data-dir", t.TempDir(), "--name", "Alpha_1"},
			2, []string{`"Alpha_1"`}},
		{"UnknownFlag", nil, []string{"up", "--client-adr", "x"},
			2, []string{"--client-adr"}},
		{"DataDirNotWritable", nil, append([]string{"up"}, upArgs(filepath.Join(file, "data"), "alpha")...),
			1, []string{"--data-dir"}},
		{"CorruptStore", nil, append([]string{"up"}, upArgs(corrupt, "alpha")...),
			1, []string{"corrupt", "move it aside"}},
		{"RunWithoutNode", nil, append([]string{"run"}, upArgs(t.TempDir(), "alpha")...),
			1, []string{"meshnode genesis --data-dir"}},
		{"StatusWithoutNode", nil, []string{"status", "--data-dir", t.TempDir()},
			1, []string{"no meshnode is running"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := meshnode(t, tc.env, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, tc.code, r.stdout, r.stderr)
			}
			for _, w := range tc.wants {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q does not contain %q", r.stderr, w)
				}
			}
			if strings.Contains(r.stderr, "panic") {
				t.Errorf("stderr has a panic: %s", r.stderr)
			}
		})
	}
}

func TestBinary_Version(t *testing.T) {
	r := meshnode(t, nil, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "meshnode ") {
		t.Fatalf("version: exit %d %q", r.code, r.stdout)
	}
	for name, f := range formats.All() {
		if line := fmt.Sprintf("format %s: writes %d, reads %d to %d\n", name, f.Writes, f.ReadsFrom, f.Writes); !strings.Contains(r.stdout, line) {
			t.Errorf("version: no line %q in %q", line, r.stdout)
		}
	}
}
