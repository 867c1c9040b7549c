package main

import (
	"fmt"
	"net"
	"net/http"
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

// BenchmarkStartup measures, for a fresh data dir, the time from process start until the
// readiness endpoint answers 200, and the resident memory after a second idle. The baseline
// is nats-server embedded with JetStream and nothing else (testdata/rawnats), polled on its
// own /healthz, in the same run. Targets (issue 2): ready < 500 ms, idle RSS < 60 MiB.
//
//	go test -run '^$' -bench Startup -benchtime 10x ./cmd/meshnode/
func BenchmarkStartup(b *testing.B) {
	raw := filepath.Join(filepath.Dir(binary), "rawnats")
	if out, err := exec.Command("go", "build", "-o", raw, "./testdata/rawnats").CombinedOutput(); err != nil {
		b.Fatalf("build rawnats: %v\n%s", err, out)
	}
	b.Run("meshnode", func(b *testing.B) {
		benchStartup(b, func(dir, httpAddr string) *exec.Cmd {
			return exec.Command(binary, "up", "--data-dir", dir, "--name", "bench",
				"--client-addr", "127.0.0.1:0", "--http-addr", httpAddr, "--log-level", "error")
		}, "/readyz")
	})
	b.Run("raw-nats", func(b *testing.B) {
		benchStartup(b, func(dir, httpAddr string) *exec.Cmd {
			_, port, _ := net.SplitHostPort(httpAddr)
			return exec.Command(raw, "--store-dir", dir, "--http-port", port)
		}, "/healthz")
	})
}

func benchStartup(b *testing.B, command func(dir, httpAddr string) *exec.Cmd, path string) {
	var readyTotal time.Duration
	var rssTotal float64
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		httpAddr := testbed.FreeAddr(b)
		cmd := command(dir, httpAddr)
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		url := "http://" + httpAddr + path
		for {
			resp, err := http.Get(url)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Since(start) > 30*time.Second {
				cmd.Process.Kill()
				b.Fatalf("%s not ready after 30s", url)
			}
			time.Sleep(2 * time.Millisecond)
		}
		readyTotal += time.Since(start)
		b.StopTimer()
		time.Sleep(time.Second) // let it sit idle: the figure is the idle footprint
		rss, err := rssMiB(cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		rssTotal += rss
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		b.StartTimer()
	}
	b.ReportMetric(float64(readyTotal.Milliseconds())/float64(b.N), "ms-to-ready")
	b.ReportMetric(rssTotal/float64(b.N), "MiB-idle-rss")
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
