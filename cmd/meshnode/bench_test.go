package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

// startupIdle is how long BenchmarkStartup lets a started process sit idle before it reads
// its RSS.
var startupIdle = flag.Duration("startup-idle", time.Second, "how long BenchmarkStartup lets a process idle before reading its RSS")

// BenchmarkStartup measures, for a fresh data dir and for one a node ran on before, the time
// from process start until the readiness endpoint answers 200, and the resident memory after
// it has sat idle for -startup-idle (default 1s). The baseline is nats-server embedded with
// JetStream and nothing else (testdata/rawnats), polled on its own /healthz, in the same run.
// meshnode is the binary an operator runs, staged by scripts/install.sh; the baseline is
// built with the script's flags (static, trimmed, stripped). Targets (issue 20): ready
// ≤ 100 ms fresh, ≤ 60 ms existing, idle RSS ≤ 30 MiB.
//
//	go test -run '^$' -bench Startup -benchtime 10x ./cmd/meshnode/
//	go test -run '^$' -bench 'Startup/(meshnode|raw-nats)$' -benchtime 3x ./cmd/meshnode/ -startup-idle 2m
func BenchmarkStartup(b *testing.B) {
	root := b.TempDir()
	if out, err := exec.Command("bash", "../../scripts/install.sh", "--root", root).CombinedOutput(); err != nil {
		b.Fatalf("install.sh: %v\n%s", err, out)
	}
	installed := filepath.Join(root, "usr/local/bin/meshnode")
	raw := filepath.Join(root, "rawnats")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", raw, "./testdata/rawnats")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as install.sh builds meshnode
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build rawnats: %v\n%s", err, out)
	}
	mesh := func(dir, httpAddr string) *exec.Cmd {
		cmd := exec.Command(installed, "up", "--data-dir", dir, "--name", "bench",
			"--client-addr", "127.0.0.1:0", "--http-addr", httpAddr, "--log-level", "error")
		cmd.Env = cleanEnv() // the node's settings are the flags', not the caller's MESHNODE_ variables
		return cmd
	}
	rawNATS := func(dir, httpAddr string) *exec.Cmd {
		_, port, _ := net.SplitHostPort(httpAddr)
		return exec.Command(raw, "--store-dir", dir, "--http-port", port)
	}
	b.Run("meshnode", func(b *testing.B) { benchStartup(b, mesh, "/readyz", false) })
	b.Run("raw-nats", func(b *testing.B) { benchStartup(b, rawNATS, "/healthz", false) })
	b.Run("meshnode-existing", func(b *testing.B) { benchStartup(b, mesh, "/readyz", true) })
	b.Run("raw-nats-existing", func(b *testing.B) { benchStartup(b, rawNATS, "/healthz", true) })
}

// benchStartup times b.N starts; with existing, each on a data dir a first, untimed, start
// made and stopped. Each started process sits idle for -startup-idle before its RSS is read.
func benchStartup(b *testing.B, command func(dir, httpAddr string) *exec.Cmd, path string, existing bool) {
	var readyTotal time.Duration
	var rssTotal float64
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		if existing {
			b.StopTimer()
			httpAddr := testbed.FreeAddr(b)
			first := launchCmd(b, command(dir, httpAddr), "up")
			first.awaitHTTP(b, "http://"+httpAddr+path, time.Now())
			first.stop(b, syscall.SIGTERM)
			b.StartTimer()
		}
		httpAddr := testbed.FreeAddr(b)
		start := time.Now()
		p := launchCmd(b, command(dir, httpAddr), "up")
		p.awaitHTTP(b, "http://"+httpAddr+path, start)
		readyTotal += time.Since(start)
		b.StopTimer()
		time.Sleep(*startupIdle) // let it sit idle: the figure is the idle footprint
		rss, err := rssMiB(p.cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		rssTotal += rss
		p.stop(b, syscall.SIGTERM)
		b.StartTimer()
	}
	b.ReportMetric(float64(readyTotal.Milliseconds())/float64(b.N), "ms-to-ready")
	b.ReportMetric(rssTotal/float64(b.N), "MiB-idle-rss")
}

// awaitHTTP polls url every 2 ms until it answers 200 (the benchmark's figure is when). A
// process that ends first, or is not ready within 30 s, fails the benchmark with what it
// said.
func (p *process) awaitHTTP(b *testing.B, url string, start time.Time) {
	b.Helper()
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Since(start) > 30*time.Second {
			p.cmd.Process.Kill()
			<-p.done
			b.Fatalf("%s not ready after 30s; the process said:\n%s", url, p.stderr)
		}
		select {
		case err := <-p.done:
			b.Fatalf("%s: the process ended (%v) before it was ready; it said:\n%s", url, err, p.stderr)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// rssMiB reads a process's resident set size from /proc.
func rssMiB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// BenchmarkFormation measures n fresh processes forming a mesh on loopback, for meshes of 3,
// 5 and 7 servers: the founding node (`run` after `genesis --expect n`) and its peers (`join`
// with the founding token) are started one after another, and each run is timed from the
// moment the last join starts until every process has printed its ready line. It logs every
// run and reports the median, the slowest and how many runs took over 2 s (issue 18: p50
// ≤ 2 s for three; issue 37: every run ≤ 2 s for five and seven, over 10 runs).
//
//	go test -run '^$' -bench 'Formation/servers=(5|7)$' -benchtime 10x ./cmd/meshnode/
func BenchmarkFormation(b *testing.B) {
	for _, n := range []int{3, 5, 7} {
		b.Run(fmt.Sprintf("servers=%d", n), func(b *testing.B) { benchFormation(b, n) })
	}
}

// benchFormation is BenchmarkFormation for a mesh of n servers.
func benchFormation(b *testing.B, n int) {
	const target = 2 * time.Second
	var took []time.Duration
	over := 0
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		d, err := formOnce(b, n)
		for retries := 0; errors.Is(err, errPortTaken) && retries < 3; retries++ {
			// A port testbed.FreeAddr picked was taken before the node bound it: the run
			// measures nothing, and is made again on fresh ports.
			b.Logf("run %d: %v; again on fresh ports", i+1, err)
			d, err = formOnce(b, n)
		}
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		took = append(took, d)
		if d > target {
			over++
		}
	}
	// Every run, on one line: go test keeps only the first 10 lines a benchmark logs.
	runs := make([]string, len(took))
	for i, d := range took {
		runs[i] = strconv.FormatInt(d.Milliseconds(), 10)
	}
	b.Logf("%d runs of %d servers, ms from the last join's start to all ready: %s", b.N, n, strings.Join(runs, " "))
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "ms-p50")
	b.ReportMetric(float64(took[len(took)-1].Milliseconds()), "ms-max")
	b.ReportMetric(float64(over), "runs-over-2s")
}

// errPortTaken is formOnce's error when a node could not bind a port picked for it.
var errPortTaken = errors.New("a node's port was taken before it bound it")

// formOnce forms a fresh mesh of n processes, returns how long after the last join started
// all of them were ready, and stops them.
func formOnce(b *testing.B, n int) (time.Duration, error) {
	b.Helper()
	nodes := make([][]string, n)
	for j := range nodes {
		dir := b.TempDir()
		nodes[j] = []string{"--data-dir", dir, "--name", string(rune('a' + j)), "--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--cluster-addr", testbed.FreeAddr(b), "--gossip-addr", testbed.FreeAddr(b), "--log-level", "error"}
	}
	// The nodes' settings are their flags: a MESHNODE_ variable of the caller's (CI sets
	// MESHNODE_BEDS) is refused by the CLI as unknown.
	gen := exec.Command(binary, append([]string{"genesis", "--expect", strconv.Itoa(n), "--json"}, nodes[0]...)...)
	gen.Env = cleanEnv()
	out, err := gen.Output()
	if err != nil {
		b.Fatalf("genesis: %v", err)
	}
	var g struct {
		Token string `json:"founding_token"`
	}
	if err := json.Unmarshal(out, &g); err != nil || g.Token == "" {
		b.Fatalf("genesis printed no founding token: %s", out)
	}
	tokenFile := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(g.Token), 0o600); err != nil {
		b.Fatal(err)
	}
	cmds := []*exec.Cmd{exec.Command(binary, append([]string{"run"}, nodes[0]...)...)}
	for _, flags := range nodes[1:] {
		cmds = append(cmds, exec.Command(binary, append([]string{"join", "--token-file", tokenFile}, flags...)...))
	}
	for _, cmd := range cmds {
		cmd.Env = cleanEnv()
	}
	defer func() {
		for _, cmd := range cmds {
			if cmd.Process != nil {
				cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		for _, cmd := range cmds {
			if cmd.Process != nil {
				cmd.Wait()
			}
		}
	}()
	ready := make(chan error, len(cmds))
	for _, cmd := range cmds {
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		stderr := &testbed.SyncBuffer{}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if readyRE.MatchString(sc.Text()) {
					ready <- nil
					io.Copy(io.Discard, stdout)
					return
				}
			}
			if strings.Contains(stderr.String(), "address already in use") {
				ready <- fmt.Errorf("%w: %s", errPortTaken, stderr.String())
				return
			}
			ready <- fmt.Errorf("exited before ready: %s", stderr.String())
		}()
	}
	start := time.Now() // the last join has started
	timeout := time.After(60 * time.Second)
	for range cmds {
		select {
		case err := <-ready:
			if err != nil {
				return 0, err
			}
		case <-timeout:
			return 0, fmt.Errorf("no mesh of %d after 60s", n)
		}
	}
	return time.Since(start), nil
}
