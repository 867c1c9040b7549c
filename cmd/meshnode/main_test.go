package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/sandbox"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/sdk"
)

// binary is the meshnode binary built once for the tests that run it as a process.
var binary string

func TestMain(m *testing.M) {
	sandbox.Launcher() // a node in this test binary starts the binary as its launcher
	if url := os.Getenv("MESHNODE_TEST_WORKER"); url != "" {
		os.Exit(runWorker(url, os.Getenv("MESHNODE_TEST_WORKER_SEED")))
	}
	if url := os.Getenv("MESHNODE_TEST_EMITTER"); url != "" {
		os.Exit(runEmitter(url, os.Getenv("MESHNODE_TEST_EMITTER_SEED")))
	}
	if url := os.Getenv("MESHNODE_TEST_LOADER"); url != "" {
		os.Exit(runLoader(url, os.Getenv("MESHNODE_TEST_LOADER_SEED")))
	}
	if url := os.Getenv("MESHNODE_TEST_HOLDER"); url != "" {
		os.Exit(runHolder(url, os.Getenv("MESHNODE_TEST_HOLDER_SEED"), os.Getenv("MESHNODE_TEST_HOLDER_GATE")))
	}
	dir, err := os.MkdirTemp("", "meshnode-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "meshnode")
	// No saved context of whoever runs the tests reaches the binary under test.
	os.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build meshnode: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runWorker is the test binary run as a module process (the partition bed runs one inside a
// network namespace): it connects to url with seed, accepts the seat's "run" jobs, and prints
// every change of whether it holds the seat — "held EPOCH UNIXNANO" or "free UNIXNANO" —
// until killed.
func runWorker(url, seed string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	c, err := sdk.Connect(ctx, url, seed)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	if err := c.Accept("run", func(context.Context, sdk.Job) error { return nil }); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	fmt.Println("ready")
	was, wasEpoch := false, uint64(0)
	for {
		held, epoch := c.Holding("jobs")
		if held != was || (held && epoch != wasEpoch) {
			now := time.Now().UnixNano()
			if was {
				fmt.Printf("free %d\n", now)
			}
			if held {
				fmt.Printf("held %d %d\n", epoch, now)
			}
			was, wasEpoch = held, epoch
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runEmitter is the test binary run as a module that emits "tick" every 50 ms with a 2 s
// deadline each, printing "acked ID UNIXNANO" or "failed UNIXNANO", until killed.
func runEmitter(url, seed string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	c, err := sdk.Connect(ctx, url, seed)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "emitter:", err)
		return 1
	}
	fmt.Println("ready")
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		id, err := c.Emit(ctx, "tick", map[string]string{"from": url})
		cancel()
		if err == nil {
			fmt.Printf("acked %s %d\n", id, time.Now().UnixNano())
		} else {
			fmt.Printf("failed %d\n", time.Now().UnixNano())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runLoader is the test binary run as the module shop: it emits loaderEvents "sold" events
// and submits loaderJobs "send" jobs to the seat mail, then prints "loaded" and exits.
func runLoader(url, seed string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := sdk.Connect(ctx, url, seed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loader:", err)
		return 1
	}
	defer c.Close()
	for i := range loaderEvents {
		if _, err := c.Emit(ctx, "sold", map[string]int{"n": i}); err != nil {
			fmt.Fprintln(os.Stderr, "loader: emit:", err)
			return 1
		}
	}
	for i := range loaderJobs {
		if _, err := c.Submit(ctx, "mail", "send", map[string]int{"n": i}); err != nil {
			fmt.Fprintln(os.Stderr, "loader: submit:", err)
			return 1
		}
	}
	fmt.Println("loaded")
	return 0
}

// runHolder is the test binary run as the module mailer: it holds the seat mail (printing
// "held EPOCH" at each new epoch) and handles its "send" jobs only once the file gate exists,
// printing "job N" for each, until killed. Until then the jobs stay queued under a held seat.
func runHolder(url, seed, gate string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	c, err := sdk.Connect(ctx, url, seed, sdk.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	var out sync.Mutex
	err = c.Accept("send", func(ctx context.Context, j sdk.Job) error {
		for {
			if _, err := os.Stat(gate); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		var body struct{ N int }
		if err := json.Unmarshal(j.Data, &body); err != nil {
			return err
		}
		out.Lock()
		fmt.Printf("job %d\n", body.N)
		out.Unlock()
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	var was uint64
	for {
		if held, epoch := c.Holding("mail"); held && epoch != was {
			out.Lock()
			fmt.Printf("held %d\n", epoch)
			out.Unlock()
			was = epoch
		} else if !held && was != 0 {
			out.Lock()
			fmt.Printf("free\n")
			out.Unlock()
			was = 0
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// What runLoader puts in the mesh.
const (
	loaderEvents = 10000
	loaderJobs   = 100
)

// result is what a finished meshnode command did.
type result struct {
	code           int
	stdout, stderr string
}

// meshnode runs the binary to completion with args and extra environment.
func meshnode(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return meshnodeIn(t, "", env, args...)
}

// meshnodeIn is meshnode run in the working directory dir ("": the test's).
func meshnodeIn(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	// Past the CLI's own 30 s bound on a request (requestTimeout), so that a verb that waits
	// that long says why, rather than being killed with nothing said.
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout+15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Dir, cmd.Env = dir, append(cleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run meshnode %v: %v", args, err)
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// cleanEnv is the test's environment without MESHNODE_ variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MESHNODE_") {
			env = append(env, kv)
		}
	}
	return env
}

// process is a meshnode node running as a child process.
type process struct {
	cmd       *exec.Cmd
	verb      string
	ready     chan []string
	clientURL string
	httpURL   string
	meshID    string
	stderr    *testbed.SyncBuffer
	done      chan error
}

var readyRE = regexp.MustCompile(`^meshnode ready: node (\S+), mesh (\S+), client (\S+), http (\S+)$`)

// startNode starts `meshnode <verb> args...` and waits for its ready line.
func startNode(t *testing.T, verb string, args ...string) *process {
	t.Helper()
	p := launch(t, verb, args...)
	p.awaitReady(t, 30*time.Second)
	return p
}

// launch starts `meshnode <verb> args...` without waiting: nodes that form a mesh are
// ready only once all of them run.
func launch(t *testing.T, verb string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(binary, append([]string{verb}, args...)...)
	cmd.Env = cleanEnv()
	return launchCmd(t, cmd, verb)
}

// launchCmd is launch for a prepared command (one run in a network namespace).
func launchCmd(t testing.TB, cmd *exec.Cmd, verb string) *process {
	t.Helper()
	// A root node's modules run as uids of their own, which must pass through to its data dir.
	if i := slices.Index(cmd.Args, "--data-dir"); i > 0 && i+1 < len(cmd.Args) {
		testbed.Passable(cmd.Args[i+1])
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, verb: verb, stderr: &testbed.SyncBuffer{}, done: make(chan error, 1), ready: make(chan []string, 1)}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := readyRE.FindStringSubmatch(sc.Text()); m != nil {
				p.ready <- m
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.done
		}
		// Its modules outlive a SIGKILL (its next start would end them): ended here.
		if i := slices.Index(cmd.Args, "--data-dir"); i > 0 && i+1 < len(cmd.Args) {
			testbed.EndNodeCgroups(cmd.Args[i+1])
		}
	})
	return p
}

// awaitReady waits for the process's ready line.
func (p *process) awaitReady(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case m := <-p.ready:
		p.meshID, p.clientURL, p.httpURL = m[2], m[3], m[4]
	case err := <-p.done:
		t.Fatalf("meshnode %s exited before ready: %v\n%s", p.verb, err, p.stderr)
	case <-time.After(timeout):
		t.Fatalf("meshnode %s not ready after %s\n%s", p.verb, timeout, p.stderr)
	}
}

// stop sends sig and returns the exit code and how long the process took to exit.
func (p *process) stop(t testing.TB, sig syscall.Signal) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("meshnode did not exit 20s after %v\n%s", sig, p.stderr)
	}
	return p.cmd.ProcessState.ExitCode(), time.Since(start)
}

// retryUntil polls f until it returns nil or the timeout passes.
var retryUntil = testbed.RetryUntil
