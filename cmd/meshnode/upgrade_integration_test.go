//go:build integration

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/nats-io/nats.go/jetstream"
)

// TestIntegration_UpgradeInPlace: a mesh of five made by the meshnode before this change —
// every stream at three copies, the seat's queue with its fixed reservation, 100 jobs queued
// under no holder, 10,000 events — is upgraded one server at a time (each stopped and
// started again with this meshnode on its data dir, the others serving meanwhile). After it
// every stream the mesh depends on keeps five copies with quorum, the seat's queue reserves
// what its declaration asks, every job is still queued and is handled once a holder comes,
// and every event is in EVENTS and in each node's audit log.
func TestIntegration_UpgradeInPlace(t *testing.T) {
	old := testbed.BuildAt(t, testbed.UpgradeFrom(t), cleanEnv())
	nodes := make([]*meshNode, 5)
	for i := range nodes {
		nodes[i] = newMeshNode(t, string(rune('a'+i)))
	}
	a := nodes[0]
	gen := exec.Command(old, append([]string{"genesis", "--expect", "5", "--json"}, a.flags...)...)
	gen.Env = cleanEnv()
	out, err := gen.Output()
	if err != nil {
		t.Fatalf("genesis with the old meshnode: %v", err)
	}
	var g struct {
		Token string `json:"founding_token"`
	}
	if json.Unmarshal(out, &g); g.Token == "" {
		t.Fatalf("no founding token: %s", out)
	}
	for i, n := range nodes {
		verb, args := "run", n.flags
		if i > 0 {
			verb = "join"
		}
		cmd := exec.Command(old, append([]string{verb}, args...)...)
		cmd.Env = append(cleanEnv(), config.TokenEnv+"="+g.Token)
		n.p = launchCmd(t, cmd, verb)
	}
	for _, n := range nodes {
		n.p.awaitReady(t, 2*time.Minute)
	}
	op := filepath.Join(a.dir, "operator.nk")
	mailer := registerModule(t, a.dir, "module: mailer\nrequires: [mesh-bus]\nseats:\n  mail: {scope: mesh, retain: 1d, accepts: [send]}\n")
	shop := registerModule(t, a.dir, "module: shop\nrequires: [mesh-bus]\nemits: [sold]\nuses: [mail]\n")
	registerModule(t, a.dir, "module: ledger\nrequires: [mesh-bus]\nconsumes: [shop.sold]\n")
	loader := exec.Command(os.Args[0])
	loader.Env = append(cleanEnv(), "MESHNODE_TEST_LOADER="+a.p.clientURL, "MESHNODE_TEST_LOADER_SEED="+shop)
	if out, err := loader.CombinedOutput(); err != nil || !strings.Contains(string(out), "loaded") {
		t.Fatalf("load the old mesh: %v\n%s", err, out)
	}
	streams := []string{"KV_mesh-registry", "KV_mesh-vault", "KV_mesh-seats", "EVENTS", "DEAD", "STATE", "SEAT_mail"}
	configs := func(url string) map[string]jetstream.StreamConfig {
		nc, err := operatorConn(url, a.dir)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out := map[string]jetstream.StreamConfig{}
		for _, name := range streams {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatalf("stream %s: %v", name, err)
			}
			out[name] = s.CachedInfo().Config
		}
		return out
	}
	before := configs(a.p.clientURL)
	for name, cfg := range before {
		if cfg.Replicas != 3 {
			t.Fatalf("the old mesh keeps %d copies of %s, want the 3 it kept before", cfg.Replicas, name)
		}
	}
	t.Logf("before: SEAT_mail reserves %d bytes", before["SEAT_mail"].MaxBytes)

	// One server at a time: stopped, started with this meshnode, ready before the next.
	for _, n := range nodes {
		if code, _ := n.p.stop(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("the old %s exited %d on SIGTERM:\n%s", n.name, code, n.p.stderr)
		}
		n.p = launch(t, "run", n.flags...)
		n.p.awaitReady(t, 2*time.Minute)
	}

	retryUntil(t, 2*time.Minute, func() error {
		r := meshnode(t, nil, "status", "--json", "--data-dir", a.dir)
		var st api.NodeStatus
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Replication == nil {
			return fmt.Errorf("status: exit %d %v %s %s", r.code, err, r.stdout, r.stderr)
		}
		if st.Replication.Target != 5 || st.Replication.Error != "" {
			return fmt.Errorf("replication after the upgrade: %+v", st.Replication)
		}
		for _, s := range st.Replication.Streams {
			if s.Replicas != 5 || s.Current != 5 || !s.Quorum {
				return fmt.Errorf("%s after the upgrade: %+v", s.Name, s)
			}
		}
		// Every server tells its version in its gossip, so status shows the upgrade done.
		if len(st.Members) != 5 {
			return fmt.Errorf("status lists the versions of %d servers, want 5: %+v", len(st.Members), st.Members)
		}
		for _, m := range st.Members {
			if m.Version != st.Version {
				return fmt.Errorf("status: server %s runs %q after the upgrade, want %s", m.Name, m.Version, st.Version)
			}
		}
		return nil
	})
	after := configs(a.p.clientURL)
	t.Logf("after: SEAT_mail reserves %d bytes", after["SEAT_mail"].MaxBytes)
	if after["SEAT_mail"].MaxBytes >= before["SEAT_mail"].MaxBytes {
		t.Errorf("SEAT_mail reserves %d bytes after the upgrade, %d before: want what its declaration asks, less than the old fixed share",
			after["SEAT_mail"].MaxBytes, before["SEAT_mail"].MaxBytes)
	}
	// Every event is still in EVENTS and in every node's audit log, once.
	for _, n := range nodes {
		retryUntil(t, time.Minute, func() error {
			ids := auditIDs(t, n.dir, op, "shop")
			if len(ids) != loaderEvents {
				return fmt.Errorf("%s's audit log has %d of shop's %d events", n.name, len(ids), loaderEvents)
			}
			for id, times := range ids {
				if times != 1 {
					return fmt.Errorf("%s's audit log has event %s %d times", n.name, id, times)
				}
			}
			return nil
		})
	}
	// Every queued job is still queued, and handled once a holder comes.
	r := meshnode(t, nil, "seat", "ls", "--json", "--data-dir", a.dir, "--creds", op)
	if !strings.Contains(r.stdout, fmt.Sprintf(`"backlog":%d`, loaderJobs)) {
		t.Fatalf("seat mail after the upgrade: want %d jobs queued: %s %s", loaderJobs, r.stdout, r.stderr)
	}
	gate := filepath.Join(t.TempDir(), "gate")
	os.WriteFile(gate, nil, 0o600)
	holderOut := &testbed.SyncBuffer{}
	holder := exec.Command(os.Args[0])
	holder.Env = append(cleanEnv(), "MESHNODE_TEST_HOLDER="+nodes[2].p.clientURL, "MESHNODE_TEST_HOLDER_SEED="+mailer, "MESHNODE_TEST_HOLDER_GATE="+gate)
	holder.Stdout, holder.Stderr = holderOut, holderOut
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	retryUntil(t, time.Minute, func() error {
		for i := range loaderJobs {
			if !strings.Contains(holderOut.String(), fmt.Sprintf("job %d\n", i)) {
				return fmt.Errorf("job %d not handled: %s", i, holderOut)
			}
		}
		return nil
	})
}
