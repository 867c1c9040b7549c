package chaos

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

// JSModule is examples/node/module.js — a module written with the plain nats and nkeys.js
// packages, no sdk — running as one module of the mesh, its stdout read into a History: each
// event it handled is a "deliver" operation, each event it emitted an "emit" operation,
// acked when the stream acked it.
type JSModule struct {
	module string
	cmd    *exec.Cmd
	h      *History

	mu      sync.Mutex
	tail    []string       // its last output lines, stdout and stderr, for a failure message
	whole   *os.File       // every output line; nil if the file could not be made
	emits   map[string]*Op // emits begun and not yet ended, by event id
	ready   chan struct{}  // closed when it says it is ready
	isReady bool

	exited   chan struct{} // closed once both outputs are read and the process waited for
	stopOnce sync.Once
}

// jsTailLines is how many of its last output lines a JSModule keeps.
const jsTailLines = 50

// jsStartTimeout bounds how long StartJSModule waits for the module's ready line: it asks the
// controller who it is (whoami), then opens its consumer.
const jsStartTimeout = 60 * time.Second

// jsStopGrace is how long Stop waits after SIGTERM (the module drains its connection) before
// SIGKILL.
const jsStopGrace = 10 * time.Second

// StartJSModule runs examples/node/module.js as module (registered, its seed in seedFile)
// against the node at url, trusting the mesh's CA in caFile ("" for a plain client port, on
// loopback), and returns once the module says it is ready. Its operations are recorded in h
// with Process = module. The test is skipped where Node.js or npm is missing (it fails
// instead under MESHNODE_BEDS=must-run); `npm ci` installs the example's packages first when
// they are missing. The module is stopped when the test ends.
func StartJSModule(t testing.TB, url, seedFile, caFile, module string, h *History) (*JSModule, error) {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			testbed.Skip(t, "%s is not installed: the Node.js module needs Node.js 20 and npm", tool)
		}
	}
	dir, err := nodeExampleDir()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("node", "module.js")
	cmd.Dir = dir
	cmd.Env = append(moduleEnv(), "MESHNODE_URL="+url, "MESHNODE_SEED="+seedFile)
	if caFile != "" {
		cmd.Env = append(cmd.Env, "MESH_CA="+caFile)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node module.js in %s: %w", dir, err)
	}
	m := &JSModule{module: module, cmd: cmd, h: h, emits: map[string]*Op{},
		ready: make(chan struct{}), exited: make(chan struct{})}
	// Its whole output too, in a file that outlives the test: a stall is seen in what came
	// long before the tail.
	if f, err := os.CreateTemp("", "chaos-js-"+module+"-*.log"); err == nil {
		m.whole = f
		t.Cleanup(func() {
			if !t.Failed() {
				os.Remove(f.Name())
			}
		})
	}
	var outputs sync.WaitGroup
	outputs.Add(2)
	go func() { defer outputs.Done(); m.read(stdout, m.line) }()
	go func() { defer outputs.Done(); m.read(stderr, func(string) {}) }()
	go func() {
		// Wait only once the outputs are read: it closes the pipes.
		outputs.Wait()
		cmd.Wait()
		if m.whole != nil {
			m.whole.Close()
		}
		close(m.exited)
	}()
	t.Cleanup(m.Stop)

	select {
	case <-m.ready:
		return m, nil
	case <-m.exited:
		return nil, fmt.Errorf("module.js (as %s) exited before it was ready: %s; its output:\n%s", module, cmd.ProcessState, m.Log())
	case <-time.After(jsStartTimeout):
		m.Stop()
		return nil, fmt.Errorf("module.js (as %s) not ready after %s: is the mesh's controller up, and %s registered? its output:\n%s", module, jsStartTimeout, module, m.Log())
	}
}

// read keeps every line of r in the tail and hands it to handle.
func (m *JSModule) read(r io.Reader, handle func(string)) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		m.mu.Lock()
		m.tail = append(m.tail, line)
		if m.whole != nil {
			fmt.Fprintln(m.whole, line)
		}
		if len(m.tail) > jsTailLines {
			m.tail = m.tail[len(m.tail)-jsTailLines:]
		}
		m.mu.Unlock()
		handle(line)
	}
	io.Copy(io.Discard, r) // a line too long for the scanner: drained, so the module never blocks
}

// line records what one line of module.js's stdout says (a timestamp, then what it did; see
// examples/node/README.md): "emitting <event> <id>" begins an emit, "emitted <event> <id>"
// acks it, "emit-failed <event> <id> <reason>" fails it, "handled <subject> <id>" is a
// delivery it acked.
func (m *JSModule) line(line string) {
	f := strings.Fields(line)
	if len(f) < 3 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch what := f[1]; {
	case what == "ready" && f[2] == m.module && !m.isReady:
		m.isReady = true
		close(m.ready)
	case len(f) < 4:
	case what == "emitting":
		m.emits[f[3]] = m.h.Invoke(m.module, "emit", f[3], f[2])
	case what == "emitted" || what == "emit-failed":
		op := m.emits[f[3]]
		if op == nil { // its start was not seen: the ack is as early as it can be placed
			op = m.h.Invoke(m.module, "emit", f[3], f[2])
		}
		delete(m.emits, f[3])
		var err error
		if what == "emit-failed" {
			err = errors.New("module.js gave the publish up: " + strings.Join(f[4:], " "))
		}
		op.Done(err)
	case what == "handled":
		m.h.Invoke(m.module, "deliver", f[3], f[2]).Done(nil)
	}
}

// Stop ends the module: SIGTERM (it drains its connection), SIGKILL when it has not exited
// after a grace period; it returns once its output is read. An emit it began and did not
// end stays pending: its outcome is unknown. Stopping twice is harmless.
func (m *JSModule) Stop() {
	m.stopOnce.Do(func() {
		m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(jsStopGrace):
			m.cmd.Process.Kill()
			<-m.exited
		}
	})
}

// Log returns the module's last output lines, stdout and stderr, for a failure message.
func (m *JSModule) Log() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.whole != nil {
		return strings.Join(m.tail, "\n") + "\n(its whole output: " + m.whole.Name() + ")"
	}
	return strings.Join(m.tail, "\n")
}

// moduleEnv is this process's environment without MESHNODE_* and MESH_* variables: the
// test's own (CI sets MESHNODE_BEDS) are not the module's, and a MESH_URL would take the
// place of the URL it is given.
func moduleEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MESHNODE_") && !strings.HasPrefix(kv, "MESH_") {
			env = append(env, kv)
		}
	}
	return env
}

// npmInstall serializes the installs of this process's modules: one npm ci at a time in the
// example's directory.
var npmInstall sync.Mutex

// nodeExampleDir returns examples/node in the repository this package was built from, with
// its packages installed (npm ci, from its committed lock file) when they are missing.
func nodeExampleDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("the chaos package cannot tell where its source is, so where examples/node is: build it without -trimpath")
	}
	dir := filepath.Join(filepath.Dir(filepath.Dir(file)), "examples", "node")
	npmInstall.Lock()
	defer npmInstall.Unlock()
	// esbuild, the last of its packages: what the repository's other beds check too.
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".bin", "esbuild")); err == nil {
		return dir, nil
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm ci in %s: %w (does it reach the npm registry?)\n%s", dir, err, out)
	}
	return dir, nil
}
