//go:build integration

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/bench"
)

// TestIntegration_BenchNodeProcess: `meshnode bench --node-process` runs its node as a
// process of its own, weighs it with the modules registered and again connected, restarts it,
// and finds every module registered after the restart; the node goes with bench and leaves
// nothing behind.
func TestIntegration_BenchNodeProcess(t *testing.T) {
	tmp := t.TempDir()
	res, out := benchJSON(t, tmp, "--events", "0", "--calls", "0", "--modules", "24", "--node-process")
	c := res.Connect
	if c == nil || !c.Node || c.Connected != 23 {
		t.Fatalf("connect: %s", out)
	}
	if c.RSSIdle <= 0 || c.RSSConnected <= 0 {
		t.Errorf("the node's RSS: %d registered, %d connected; want both read", c.RSSIdle, c.RSSConnected)
	}
	r := c.Restart
	if r == nil {
		t.Fatalf("no restart: %s", out)
	}
	if r.Modules != 24 || r.Ready <= 0 || r.Registry <= 0 || r.Reconcile <= 0 {
		t.Errorf("restart %+v: want the 24 modules listed, and its ready, registry and reconcile times", *r)
	}
	if entries, err := os.ReadDir(tmp); err != nil || len(entries) != 0 {
		t.Errorf("bench left %d entries in the temporary directory (%v)", len(entries), err)
	}
}

// TestIntegration_BenchCPUs: `meshnode bench --cpus 1` runs the whole bench on one CPU (it
// executes itself again there) and says so; more CPUs than the process may run on is a usage
// error.
func TestIntegration_BenchCPUs(t *testing.T) {
	res, _ := benchJSON(t, t.TempDir(), "--cpus", "1", "--events", "50", "--calls", "0", "--modules", "0")
	if res.CPUs != 1 || res.GOMAXPROCS != 1 || res.EmitOn == nil || res.EmitOn.Mesh.Count != 50 {
		t.Fatalf("bench --cpus 1: cpus %d, gomaxprocs %d, emit→on %v; want 1, 1 and 50 events", res.CPUs, res.GOMAXPROCS, res.EmitOn)
	}
	r := meshnode(t, nil, "bench", "--cpus", fmt.Sprint(runtime.NumCPU()+1), "--events", "10", "--calls", "0", "--modules", "0")
	if r.code != exitUsage || !strings.Contains(r.stderr, "may run on") {
		t.Fatalf("bench --cpus past the machine's: exit %d %s, want a usage error saying how many", r.code, r.stderr)
	}
}

// benchJSON runs `meshnode bench --json` with args, its throwaway node's data dir in tmp, and
// returns the results and the output they were read from.
func benchJSON(t *testing.T, tmp string, args ...string) (bench.Results, []byte) {
	t.Helper()
	cmd := exec.Command(binary, append(append([]string{"bench"}, args...), "--json")...)
	cmd.Env = append(cleanEnv(), "TMPDIR="+tmp)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		t.Fatalf("bench %v: %v\n%s", args, err, stderr)
	}
	var res bench.Results
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("output is not the results as JSON: %v\n%s", err, out)
	}
	return res, out
}
