package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/bench"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/backoff"
)

// benchProcess is bench's throwaway node run as a process of its own (`meshnode up`, this
// binary), so that its resident memory is the node's alone and it can be restarted. Its
// addresses are fixed for its life: a restart keeps the Target's URL.
type benchProcess struct {
	exe, dir             string
	clientAddr, httpAddr string
	cmd                  *exec.Cmd
	exited               chan error // the current process's Wait
	logs                 int        // processes started, each logging to its own file
}

// openBenchProcess starts the throwaway node as a process in dir and waits until it is ready.
func openBenchProcess(ctx context.Context, dir string) (t bench.Target, p *benchProcess, err error) {
	exe, err := os.Executable()
	if err != nil {
		return t, nil, fmt.Errorf("bench --node-process: this binary's path, to run the node with: %w", err)
	}
	p = &benchProcess{exe: exe, dir: dir}
	if p.clientAddr, err = freeLoopback(); err != nil {
		return t, nil, err
	}
	if p.httpAddr, err = freeLoopback(); err != nil {
		return t, nil, err
	}
	if _, err := p.start(ctx); err != nil {
		p.Close()
		return t, nil, err
	}
	seeds := filepath.Join(dir, "bench-seeds")
	if err := os.Mkdir(seeds, 0o700); err != nil {
		p.Close()
		return t, nil, fmt.Errorf("bench: %w", err)
	}
	t = bench.Target{URL: "nats://" + p.clientAddr, OperatorSeed: filepath.Join(dir, datadir.OperatorSeedFile), Dir: seeds, Node: p}
	return t, p, nil
}

// freeLoopback returns a loopback address no one listened on a moment ago.
func freeLoopback() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("bench --node-process: find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// logFile is the node's log of its n-th start.
func (p *benchProcess) logFile(n int) string {
	return filepath.Join(p.dir, "node-"+strconv.Itoa(n)+".log")
}

// start runs the node and returns once its readiness endpoint answers 200, with the time it
// took.
func (p *benchProcess) start(ctx context.Context) (time.Duration, error) {
	p.logs++
	logPath := p.logFile(p.logs)
	log, err := os.Create(logPath)
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	defer log.Close()
	// Debug: the node logs its start steps, which Restart reads.
	p.cmd = exec.Command(p.exe, "up", "--data-dir", p.dir, "--name", "bench",
		"--client-addr", p.clientAddr, "--http-addr", p.httpAddr, "--rate-limit", "0", "--emit-rate", "0", "--flood-rate", strconv.Itoa(bench.NodeFloodRate),
		"--log-level", "debug", "--log-format", "text")
	var env []string // the node's settings are the flags', not the caller's MESHNODE_ variables
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MESHNODE_") {
			env = append(env, kv)
		}
	}
	p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = env, log, log
	// Killed with bench, however bench ends: a throwaway node must not outlive it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	began := time.Now()
	if err := p.cmd.Start(); err != nil {
		return 0, fmt.Errorf("bench: start the node (%s up): %w", p.exe, err)
	}
	p.exited = make(chan error, 1)
	go func(cmd *exec.Cmd, exited chan<- error) { exited <- cmd.Wait() }(p.cmd, p.exited)
	wait := backoff.Backoff{First: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		if ready(ctx, "http://"+p.httpAddr+"/readyz") {
			return time.Since(began), nil
		}
		select {
		case err := <-p.exited:
			p.cmd = nil
			return 0, fmt.Errorf("bench: the node exited before it was ready (%v); its log is %s:\n%s", err, logPath, tail(logPath))
		default:
		}
		if err := wait.Wait(ctx); err != nil {
			return 0, fmt.Errorf("bench: the node was not ready in time (%w); its log is %s:\n%s", err, logPath, tail(logPath))
		}
	}
}

// ready reports whether url answers 200.
func ready(ctx context.Context, url string) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// tail is the last lines of a log, for an error.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// RSS reads the node process's resident memory from /proc (Linux).
func (p *benchProcess) RSS() (int64, error) {
	if p.cmd == nil {
		return 0, errors.New("bench: the node is not running")
	}
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.cmd.Process.Pid), "status"))
	if err != nil {
		return 0, fmt.Errorf("bench: the node's memory is read from /proc, on Linux only: %w", err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("bench: the node's VmRSS %q: %w", rest, err)
			}
			return kib << 10, nil
		}
	}
	return 0, errors.New("bench: the node's /proc status has no VmRSS")
}

// Restart stops the node with SIGTERM, as a service manager does, starts it again on the
// same data dir and reads what its start took from its log.
func (p *benchProcess) Restart(ctx context.Context) (bench.Restarted, error) {
	var r bench.Restarted
	began := time.Now()
	if err := p.stop(syscall.SIGTERM); err != nil {
		return r, err
	}
	r.Stop = time.Since(began)
	var err error
	if r.Ready, err = p.start(ctx); err != nil {
		return r, err
	}
	steps, err := startSteps(p.logFile(p.logs))
	if err != nil {
		return r, err
	}
	r.Registry = steps["registry"]
	r.Reconcile = steps["topology"] - steps["identity"]
	return r, nil
}

// stepLine is the node's debug line for a start step done (node.startStep).
var stepLine = regexp.MustCompile(`msg="start step done".* step="?([a-z ]+?)"? after=(\S+)`)

// startSteps reads the start steps of a node's log: when each was done, from the node's open.
func startSteps(path string) (map[string]time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	steps := map[string]time.Duration{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if m := stepLine.FindStringSubmatch(sc.Text()); m != nil {
			if d, err := time.ParseDuration(m[2]); err == nil {
				steps[m[1]] = d
			}
		}
	}
	for _, want := range []string{"registry", "identity", "topology"} {
		if _, ok := steps[want]; !ok {
			return nil, fmt.Errorf("bench: the node's log %s has no start step %q: has node.startStep's debug line changed?", path, want)
		}
	}
	return steps, nil
}

// stop signals the node and waits for it to exit.
func (p *benchProcess) stop(sig syscall.Signal) error {
	if p.cmd == nil {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("bench: stop the node: %w", err)
	}
	err := <-p.exited
	p.cmd = nil
	var exit *exec.ExitError
	if sig == syscall.SIGKILL && errors.As(err, &exit) {
		return nil // killed, as asked
	}
	if err != nil {
		return fmt.Errorf("bench: the node exited with %w; its log is %s", err, p.logFile(p.logs))
	}
	return nil
}

// Close kills the node: it is thrown away with its data, and a clean stop of thousands of
// durable consumers, one by one, would take longer than the measurements.
func (p *benchProcess) Close() error { return p.stop(syscall.SIGKILL) }
