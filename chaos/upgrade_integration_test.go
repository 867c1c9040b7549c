//go:build integration

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
)

// TestIntegration_UpgradeUnderLoad: three servers built at the commit UPGRADE_FROM names
// found a mesh and run the fault harness's workload (emits and their consumers, seat jobs
// and their fenced holders, registrations, deployments, vault writes); each server is then
// upgraded to this checkout's meshnode in turn — stopped with SIGTERM, started on its data
// dir, ready, and the mesh settled (every stream's copies current) before the next — while
// the workload goes on. After it every member reports this checkout's version, and the
// checker finds nothing acked lost, nothing handled twice (but for UPGRADE_FROM's stale
// holders, refused by the fence), no lease overlap and no secret misread.
func TestIntegration_UpgradeUnderLoad(t *testing.T) {
	old := testbed.BuildAt(t, testbed.UpgradeFrom(t), cleanEnv())
	// A restart has twice taken about 2 minutes to start its bus (docs/chaos.md): an upgrade waits for it.
	c := StartCluster(t, Options{Servers: 3, Binary: old, Flags: []string{"--isolation", "reduced"}, ReadyTimeout: 3 * time.Minute})
	h := NewHistory()
	log := slog.New(slog.NewTextHandler(&logSink{t: t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	w, err := StartWorkload(t, ctx, c, h, t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	time.Sleep(10 * time.Second) // a span of the workload on the old mesh, not a wait for a state

	for i, n := range c.Nodes {
		began := time.Now()
		// UPGRADE_FROM's meshnode frees its leases on a graceful stop before it takes its
		// holders' authority away, and serves its modules for seconds after: a holder there
		// is handed jobs another holds. The history marks the stop, so that the checker tells
		// those stale handles whose effects the fence refused from duplicates (staleHandles).
		if err := n.Stop(); err != nil {
			t.Fatal(err)
		}
		h.Span("operator", "unrevoked-stop", n.Name(), "", began, time.Now())
		if err := c.Upgrade(i); err != nil {
			t.Fatal(err)
		}
		// Settled asks the members in order, the first that reports replication deciding:
		// from the first upgrade on, an upgraded node (an older one reports none).
		testbed.RetryUntil(t, 3*time.Minute, c.Settled)
		t.Logf("upgraded %s and the mesh settled in %s", n.Name(), time.Since(began).Round(time.Millisecond))
	}
	// The last upgrade is the last "fault": the mesh was settled right after it.
	healed := time.Now()
	const readyBound = 2 * time.Minute
	testbed.RetryUntil(t, readyBound, c.Settled)
	readyAt := time.Now()

	var v struct {
		Version string `json:"version"`
	}
	// The binary's own version (no node asked: Meshnode would add a data dir).
	if r, err := c.command("version", "--json"); err != nil || r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &v) != nil || v.Version == "" {
		t.Fatalf("version --json: %v, exit %d %s %s", err, r.Code, r.Stdout, r.Stderr)
	}
	testbed.RetryUntil(t, time.Minute, func() error {
		r := c.Meshnode(t, "members", "--json")
		if r.Code != 0 {
			return fmt.Errorf("members: exit %d %s", r.Code, r.Stderr)
		}
		for line := range strings.Lines(r.Stdout) {
			var m api.NodeMember
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				return fmt.Errorf("members --json: %v: %q", err, line)
			}
			if m.Version != v.Version {
				return fmt.Errorf("member %s reports version %q after the upgrade, want %s", m.Name, m.Version, v.Version)
			}
		}
		return nil
	})

	time.Sleep(5 * time.Second) // a span of operations on the upgraded mesh, not a wait for a state
	w.StopLoads()
	final, err := w.Final(ctx, 90*time.Second)
	w.Stop()
	if err != nil {
		t.Fatalf("read the mesh after the upgrade: %v", err)
	}
	final.HealedAt, final.ReadyAt, final.ReadyBound = healed, readyAt, readyBound
	rep := Check(h.Ops(), final, WorkloadBounds())
	for _, e := range c.Exits() {
		t.Errorf("exit: %s", e)
	}
	t.Log(rep.String())
	for _, a := range rep.Anomalies() {
		t.Errorf("%s/%s: %s", a.Check, a.Kind, a.Msg)
	}
	if len(rep.Anomalies()) > 0 {
		keepAnomalies(t, rep, "upgrade")
	}
}
