//go:build integration

package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

// The tour's conventions, which this test honours: the install line (the binaries it names
// are built into a directory on PATH), a command marked to be left running (started in the
// background; the tour goes on once it prints its first line, and it is stopped with
// SIGINT, as Ctrl-C would), and a command marked as refused (it must fail).
const (
	tourInstall = "go install ./cmd/meshnode ./examples/billing"
	tourRunning = "# leave it running"
	tourRefused = "# refused"
)

// TestIntegration_READMETour runs the README's tour as written: every command of its shell
// blocks, in order, in a directory of its own with the README's examples, and fails naming
// the command that failed. The node's client and HTTP ports come from the environment
// (MESHNODE_CLIENT_ADDR, MESHNODE_HTTP_ADDR, MESH_URL), so the bed runs beside other nodes.
func TestIntegration_READMETour(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	commands := tourCommands(t, string(readme))

	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	work := filepath.Join(dir, "work")
	for _, d := range []string{bin, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := testbed.Passable(work); err != nil { // a root node's modules run as uids of their own
		t.Fatal(err)
	}
	for _, f := range []string{"examples/shop/shop.yaml", "examples/billing/billing.yaml"} {
		b, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(work, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	port := freePort(t)
	env := append(cleanEnv(),
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"MESHNODE_CLIENT_ADDR=127.0.0.1:"+port,
		"MESHNODE_HTTP_ADDR=127.0.0.1:0",
		"MESH_URL=nats://127.0.0.1:"+port,
	)

	var running []*tourProcess
	t.Cleanup(func() {
		for _, p := range running {
			p.cmd.Process.Kill() // a failed tour's leftovers; stop already ended the rest
		}
	})
	for _, line := range commands {
		switch {
		case line == tourInstall:
			if err := os.Symlink(binary, filepath.Join(bin, "meshnode")); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "billing"), "../../examples/billing").CombinedOutput(); err != nil {
				t.Fatalf("%s: build billing: %v\n%s", line, err, out)
			}
		case strings.HasPrefix(line, "go "):
			t.Fatalf("the tour runs %q, which this test does not know how to honour: use %q, or teach the test", line, tourInstall)
		case strings.Contains(line, tourRunning):
			running = append(running, startTourProcess(t, line, work, env))
		default:
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			cmd := exec.CommandContext(ctx, "sh", "-c", line)
			cmd.Dir, cmd.Env = work, env
			out, err := cmd.CombinedOutput()
			cancel()
			refused := strings.Contains(line, tourRefused)
			switch {
			case refused && err == nil:
				t.Fatalf("the tour says %q is refused, and it succeeded:\n%s", line, out)
			case !refused && err != nil:
				t.Fatalf("the tour's command %q failed: %v\n%s", line, err, out)
			}
			t.Logf("$ %s\n%s", line, out)
		}
	}
	for i := len(running) - 1; i >= 0; i-- {
		running[i].stop(t)
	}
	running = nil
}

// tourCommands returns the commands of the shell blocks in the README's section "A tour", in
// order: one a line, comments and blank lines left out.
func tourCommands(t *testing.T, readme string) []string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n## A tour\n")
	if !ok {
		t.Fatal("README.md has no section \"## A tour\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var commands []string
	inBlock := false
	for line := range strings.Lines(section) {
		line = strings.TrimSpace(line)
		switch {
		case line == "```sh":
			inBlock = true
		case line == "```":
			inBlock = false
		case inBlock && line != "" && !strings.HasPrefix(line, "#"):
			commands = append(commands, line)
		}
	}
	if len(commands) < 5 || commands[0] != tourInstall {
		t.Fatalf("the tour's commands %q: expected it to start with %q", commands, tourInstall)
	}
	return commands
}

// tourProcess is a command the tour leaves running.
type tourProcess struct {
	line   string
	cmd    *exec.Cmd
	stderr *testbed.SyncBuffer
	done   chan error
}

// startTourProcess starts line in the background and waits for its first line of output.
func startTourProcess(t *testing.T, line, dir string, env []string) *tourProcess {
	t.Helper()
	// exec: the signal reaches the command itself, not a shell around it.
	cmd := exec.Command("sh", "-c", "exec "+line)
	cmd.Dir, cmd.Env = dir, env
	p := &tourProcess{line: line, cmd: cmd, stderr: &testbed.SyncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("the tour's command %q: %v", line, err)
	}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case first <- sc.Text():
			default:
			}
		}
		p.done <- cmd.Wait()
	}()
	select {
	case out := <-first:
		t.Logf("$ %s\n%s", line, out)
	case err := <-p.done:
		t.Fatalf("the tour's command %q ended before it printed anything: %v\n%s", line, err, p.stderr.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("the tour's command %q printed nothing in 90 s\n%s", line, p.stderr.String())
	}
	return p
}

// stop sends SIGINT, as Ctrl-C does, and expects a clean exit.
func (p *tourProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("Ctrl-C to %q: %v", p.line, err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("the tour's command %q did not stop cleanly on Ctrl-C: %v\n%s", p.line, err, p.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the tour's command %q did not stop within 30 s of Ctrl-C\n%s", p.line, p.stderr.String())
	}
}

// freePort returns a TCP port on loopback that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}
