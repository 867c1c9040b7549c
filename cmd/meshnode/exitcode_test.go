package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestExitCodes: every case issue 36 lists exits as it must — 2 for a mistake in how the
// command is called, 1 for what cannot be done — and says what to do. Before, the URL and
// the names were sent to the node (exit 1), the configuration's permission error was a
// usage error with no hint, --expect 999999999999 and `completion bogus` exited 0, and
// check passed a retain JetStream refuses.
func TestExitCodes(t *testing.T) {
	// Only the variables a case sets: the test's own environment may hold others (CI's
	// MESHNODE_BEDS), which the configuration would rightly refuse.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MESHNODE_") {
			t.Setenv(k, "") // restored when the test ends
			os.Unsetenv(k)
		}
	}
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	seed := write("operator.nk", "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4\n")
	artifact := write("x", "#!/bin/sh\n")
	tiny := write("tiny.yaml", "module: tiny\nrequires: [mesh-bus]\nseats:\n  tiny-seat: {scope: mesh, retain: 1ns, accepts: [go]}\n")
	unreachable := []string{"--server", "nats://127.0.0.1:1", "--creds", seed}

	for _, tc := range []struct {
		name string
		args []string
		env  []string // NAME=value
		code int
		says string // what stderr must say: the cause or what to do
	}{
		{"a server that is no URL", []string{"module", "ls", "--server", "ht!tp://x", "--creds", seed}, nil,
			exitUsage, "write nats://HOST:PORT"},
		{"a configuration this user may not read", []string{"genesis", "--config", unreadableFile(t), "--data-dir", filepath.Join(dir, "g1"), "--name", "a"}, nil,
			exitFailed, "run meshnode as the user the node runs as"},
		{"a configuration that is endless", []string{"genesis", "--config", "/dev/zero", "--data-dir", filepath.Join(dir, "g2"), "--name", "a"}, nil,
			exitUsage, "pass --config FILE"},
		{"genesis --expect past any mesh", []string{"genesis", "--expect", "999999999999", "--data-dir", filepath.Join(dir, "g3"), "--name", "a"}, nil,
			exitUsage, "3 to 64"},
		{"completion of no shell", []string{"completion", "bogus"}, nil,
			exitUsage, "`meshnode completion --help` lists"},
		{"module remove of no name", append([]string{"module", "remove", "x y"}, unreachable...), nil,
			exitUsage, "`meshnode module ls` lists"},
		{"vault mint of no name", append([]string{"vault", "mint", "a/b"}, unreachable...), nil,
			exitUsage, "`meshnode vault ls` lists"},
		{"vault mint for no module", append([]string{"vault", "mint", "smtp", "--owner", "a.b"}, unreachable...), nil,
			exitUsage, "`meshnode module ls` lists"},
		{"artifact put of no module", append([]string{"artifact", "put", "../x", artifact, "--version", "1"}, unreachable...), nil,
			exitUsage, "`meshnode module ls` lists"},
		{"vault rotate --grace negative", append([]string{"vault", "rotate", "smtp", "--grace", "-1s"}, unreachable...), nil,
			exitUsage, "never negative"},
		{"a duration in days reaches the node", append([]string{"token", "create", "--ttl", "1d"}, unreachable...), nil,
			exitFailed, "is the node running"},
		{"a seed file that is endless", []string{"module", "ls", "--server", "nats://127.0.0.1:1", "--creds", "/dev/zero"}, nil,
			exitUsage, "pass the seed file"},
		{"a recovery key that is endless", []string{"genesis", "--data-dir", filepath.Join(dir, "g5"), "--name", "a", "--from-snapshot", artifact, "--recovery-key-file", "/dev/zero"}, nil,
			exitFailed, "too large for a recovery key"},
		{"module check of an endless file", []string{"module", "check", "/dev/zero"}, nil,
			exitFailed, "larger than the limit of 65536 bytes"},
		{"module check of a retain JetStream refuses", []string{"module", "check", tiny}, nil,
			exitFailed, "100ms"},
		{"an unknown MESHNODE_ variable", []string{"genesis", "--data-dir", filepath.Join(dir, "g4"), "--name", "a"}, []string{"MESHNODE_COLOUR=blue"},
			exitUsage, "MESHNODE_SERVER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			var out, errb strings.Builder
			if got := run(tc.args, &out, &errb); got != tc.code || !strings.Contains(errb.String(), tc.says) {
				t.Fatalf("meshnode %s: exit %d, want %d saying %q\nstderr: %s", strings.Join(tc.args, " "), got, tc.code, tc.says, errb.String())
			}
		})
	}
}

// unreadableFile is a file this process may not read: one of mode 000, or, for root (whom
// no mode stops), a write-only sysfs attribute, which the kernel refuses to open for reading.
func unreadableFile(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		p := filepath.Join(t.TempDir(), "meshnode.yaml")
		if err := os.WriteFile(p, []byte("log-level: info\n"), 0o000); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, p := range []string{"/sys/bus/platform/drivers_probe", "/sys/bus/cpu/drivers_probe", "/sys/bus/pci/rescan"} {
		f, err := os.Open(p)
		if err == nil {
			f.Close()
			continue
		}
		if errors.Is(err, fs.ErrPermission) {
			return p
		}
	}
	testbed.Skip(t, "running as root with no write-only sysfs attribute: no file here is unreadable")
	return ""
}
