//go:build integration

package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/meshnode/meshnode/bench"
)

// TestIntegration_BenchNodeProcess: `meshnode bench --node-process` runs its node as a
// process of its own, weighs it with the modules registered and again connected, restarts it,
// and finds every module registered after the restart; the node goes with bench and leaves
// nothing behind.
func TestIntegration_BenchNodeProcess(t *testing.T) {
	tmp := t.TempDir()
	cmd := exec.Command(binary, "bench", "--events", "0", "--calls", "0", "--modules", "24", "--node-process", "--json")
	cmd.Env = append(cleanEnv(), "TMPDIR="+tmp) // where the throwaway node's data dir goes
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		t.Fatalf("bench --node-process: %v\n%s", err, stderr)
	}
	var res bench.Results
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("output is not the results as JSON: %v\n%s", err, out)
	}
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
