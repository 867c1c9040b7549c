package sandbox_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/sandbox"
)

// readyScript prints one line once it runs, then idles: "running" for a benchmark.
const readyScript = `echo ready; exec sleep 600`

// started is one process a benchmark started, sandboxed or not.
type started struct {
	pid  int
	stop func()
}

// startRaw starts the script as the node did before the sandbox: its own process group,
// nothing else.
func startRaw(b *testing.B, dir string) started {
	cmd := exec.Command("/bin/sh", "-c", readyScript)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	waitReady(b, out)
	return started{pid: cmd.Process.Pid, stop: func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }}
}

// startSandboxed starts the script as the node starts a module's instance.
func startSandboxed(b *testing.B, bd *bed, name string) started {
	r, w := io.Pipe()
	p, err := bd.sb.Start(sandbox.Proc{Name: name, Path: "/bin/sh", Args: []string{"-c", readyScript}, Env: []string{"PATH=/usr/bin:/bin"},
		Dir: bd.work, Write: []string{bd.work}, User: bd.user, Limits: api.Limits{Processes: 512, Disk: 1 << 30}, DiskDir: bd.work,
		Stdout: w, Stderr: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	waitReady(b, r)
	go io.Copy(io.Discard, r)
	return started{pid: p.Pid, stop: func() { p.Kill(); p.Wait(); w.Close() }}
}

func waitReady(b *testing.B, r io.Reader) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("no ready line: %q %v", line, err)
	}
}

// BenchmarkStartToRunning is a module instance's start, from the node's call until the
// process runs its program (it printed its first line): through the sandbox (launcher,
// cgroup, uid, Landlock) against a plain exec in its own process group, as before the
// sandbox. Compare the two sub-benchmarks' ns/op.
func BenchmarkStartToRunning(b *testing.B) {
	bd := newBed(&testing.T{})
	defer bd.sb.Close()
	b.Run("raw", func(b *testing.B) {
		for b.Loop() {
			p := startRaw(b, bd.work)
			b.StopTimer()
			p.stop()
			b.StartTimer()
		}
	})
	b.Run("sandboxed", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			p := startSandboxed(b, bd, "bench."+strconv.Itoa(i))
			b.StopTimer()
			p.stop()
			b.StartTimer()
		}
	})
}

// BenchmarkFiftyIdle runs 50 idle instances for 5 s, sandboxed and raw, and reports what
// they cost: the node's CPU (the sandbox's watch of each instance's cgroup events and disk
// use) in ms per second, and the 50 processes' resident memory.
func BenchmarkFiftyIdle(b *testing.B) {
	bd := newBed(&testing.T{})
	defer bd.sb.Close()
	for _, mode := range []string{"raw", "sandboxed"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				var ps []started
				for i := range 50 {
					if mode == "raw" {
						ps = append(ps, startRaw(b, bd.work))
					} else {
						ps = append(ps, startSandboxed(b, bd, fmt.Sprintf("idle.%d", i)))
					}
				}
				before := cpuTime()
				time.Sleep(5 * time.Second) // the measured window: the instances idle, the node watches
				cpu := cpuTime() - before
				var rss int64
				for _, p := range ps {
					rss += rssKiB(p.pid)
				}
				for _, p := range ps {
					p.stop()
				}
				b.ReportMetric(float64(cpu.Microseconds())/1000/5, "node-cpu-ms/s")
				b.ReportMetric(float64(rss)/1024, "instances-MiB")
			}
		})
	}
}

// cpuTime is this process's user and system time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rssKiB is a process's resident set (VmRSS).
func rssKiB(pid int) int64 {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
