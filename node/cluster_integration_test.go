//go:build integration

package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go/jetstream"
)

// TestIntegration_Cluster_FoundingThree: genesis with --expect 3 and two nodes founding with its token
// form one cluster — nobody starts JetStream before all three meet — with one meta leader;
// an R3 stream is created, and registration works through any node.
func TestIntegration_Cluster_FoundingThree(t *testing.T) {
	start := time.Now()
	cfgs, nodes := openThree(t)
	t.Logf("three nodes formed a ready mesh in %s", time.Since(start))
	all := slices.Clone(nodes)
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	firstCtx, stopFirst := context.WithCancel(ctx)
	firstDone := make(chan struct{})
	for i, n := range nodes {
		runs.Add(1)
		go func() {
			defer runs.Done()
			if i == 0 {
				defer close(firstDone)
				n.Run(firstCtx)
				return
			}
			n.Run(ctx)
		}()
	}
	t.Cleanup(func() {
		cancel()
		runs.Wait()
		for _, n := range all {
			n.Close()
		}
	})
	for _, n := range nodes[1:] {
		if n.Identity().MeshID != nodes[0].Identity().MeshID {
			t.Fatalf("mesh ids differ: %s, %s", n.Identity().MeshID, nodes[0].Identity().MeshID)
		}
	}

	op := connect(t, nodes[0].ClientURL(), filepath.Join(cfgs[0].DataDir, datadir.OperatorSeedFile))
	defer op.Close()
	js, _ := jetstream.New(op)
	tctx, tcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer tcancel()
	var stream jetstream.Stream
	retryUntil(t, 30*time.Second, func() (err error) {
		stream, err = js.CreateStream(tctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
		return err
	})
	info, err := stream.Info(tctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("R3 stream cluster info: %+v", info.Cluster)
	}
	// The mesh's own streams are replicated too.
	events, err := js.Stream(tctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	if r := events.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("EVENTS has %d replicas, want 3", r)
	}
	// One meta leader, seen alike by every node's bus.
	leaders := map[string]bool{}
	for _, n := range nodes {
		leaders[n.Bus().MetaLeader()] = true
	}
	if len(leaders) != 1 || leaders[""] {
		t.Fatalf("meta leaders seen: %v", leaders)
	}
	// Every node's status says so, from the server: clustered, the leader, three peers.
	for _, n := range nodes {
		js := n.Status(tctx).JetStream
		if js.Mode != "clustered" || !leaders[js.MetaLeader] || len(js.Peers) != 3 {
			t.Errorf("status of %s: jetstream %s, meta leader %q, peers %v", n.Identity().Name, js.Mode, js.MetaLeader, js.Peers)
		}
	}
	b := &bed{t: t, op: op, js: js}
	b.n = &runningNode{Node: nodes[0], stop: func() {}}
	b.dir = cfgs[0].DataDir
	mSeed, reg := b.register("module: m\nrequires: [mesh-bus]\nemits: [x]\nsecrets: [k]\n")
	if reg.PublicKey == "" {
		t.Fatal("registration through the cluster returned no key")
	}
	var minted api.Secret
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "m", Name: "k"}, &minted); err != nil {
		t.Fatal(err)
	}

	// The operator is admitted by every node, and the other servers received the vault's
	// credentials: they can serve the vault.
	opB := connect(t, nodes[1].ClientURL(), filepath.Join(cfgs[0].DataDir, datadir.OperatorSeedFile))
	defer opB.Close()
	retryUntil(t, 20*time.Second, func() error {
		for _, n := range nodes[1:] {
			if !n.HasVault() {
				return fmt.Errorf("%s does not hold the vault's credentials yet", n.Identity().Name)
			}
		}
		return nil
	})

	// Losing the first node: its seats move, the vault and the registry still answer.
	stopFirst()
	<-firstDone
	nodes[0].Close()
	nodes = nodes[1:]
	// Its leaderships move (nats-server elects in 4–9 s each, under -race on 2 cores more),
	// then its seats' leases lapse: the same patience as growth's failover.
	var got api.Secret
	retryUntil(t, 90*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := vault.Call(ctx, opB, api.VaultVerbFetch, api.VaultCallerOperator, api.VaultRequest{Owner: "m", Name: "k"}, &got)
		return err
	})
	if got.Value != minted.Value {
		t.Fatalf("after losing a node the vault answered %q, want %q", got.Value, minted.Value)
	}
	retryUntil(t, 90*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := admin.Register(ctx, opB, []byte("module: m2\nrequires: [mesh-bus]\n"))
		return err
	})
	// The survivors show the first node gone, its JetStream role with it (a member gone is
	// no follower: `members`, /v1/members and the console all read this).
	retryUntil(t, 30*time.Second, func() error {
		for _, m := range nodes[0].Members() {
			if m.Name == "a" && (m.State == "alive" || m.JetStream != "offline") {
				return fmt.Errorf("b lists a as %s, JetStream %s; want it gone and offline", m.State, m.JetStream)
			} else if m.Name == "a" {
				return nil
			}
		}
		return errors.New("b does not list a")
	})

	// A node-scoped seat has one holder per node, each taking only its own node's work.
	agentSeed := filepath.Join(t.TempDir(), "agent.nk")
	opsSeed := filepath.Join(t.TempDir(), "ops.nk")
	for file, text := range map[string]string{
		agentSeed: "module: agent\nrequires: [mesh-bus]\nseats:\n  agent: {scope: node, retain: 1h, accepts: [run]}\n",
		opsSeed:   "module: ops\nrequires: [mesh-bus]\nuses: [agent]\n",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, err := admin.Register(ctx, opB, []byte(text))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, r.Seed, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	handled := map[string][]string{} // node → job ids its holder handled
	var hmu sync.Mutex
	// Each node's registry mirror learns of a registration by its watch: connect when it has.
	connectTo := func(n *node.Node, seed string) *sdk.Client {
		var c *sdk.Client
		retryUntil(t, 20*time.Second, func() (err error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err = sdk.Connect(ctx, n.ClientURL(), seed)
			return err
		})
		return c
	}
	for _, n := range nodes { // b and c
		agent := connectTo(n, agentSeed)
		defer agent.Close()
		name := n.Identity().Name
		if err := agent.Accept("run", func(_ context.Context, j sdk.Job) error {
			hmu.Lock()
			handled[name] = append(handled[name], j.ID)
			hmu.Unlock()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	sent := map[string]string{} // job id → node it was submitted on
	for _, n := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		ops := connectTo(n, opsSeed)
		for range 3 {
			id, err := ops.Submit(ctx, "agent", "run", map[string]string{"on": n.Identity().Name})
			if err != nil {
				t.Fatal(err)
			}
			sent[id] = n.Identity().Name
		}
		cancel()
		ops.Close()
	}
	retryUntil(t, 30*time.Second, func() error {
		hmu.Lock()
		defer hmu.Unlock()
		if len(handled["b"])+len(handled["c"]) != len(sent) {
			return fmt.Errorf("handled %v of %d jobs", handled, len(sent))
		}
		return nil
	})
	for node, ids := range handled {
		for _, id := range ids {
			if sent[id] != node {
				t.Fatalf("job %s submitted on %s was handled on %s", id, sent[id], node)
			}
		}
	}

	// The first node restarts: it rejoins with the majority and catches up on what it missed.
	again := node.New(cfgs[0], testLog())
	if err := again.Open(); err != nil {
		t.Fatalf("restart of the first node: %v", err)
	}
	all = append(all, again)
	runs.Add(1)
	go func() { defer runs.Done(); again.Run(ctx) }()
	opA := connect(t, again.ClientURL(), filepath.Join(cfgs[0].DataDir, datadir.OperatorSeedFile))
	defer opA.Close()
	retryUntil(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		mods, err := admin.List(ctx, opA)
		if err != nil {
			return err
		}
		if len(mods) != 4 { // m, m2, agent, ops
			return fmt.Errorf("the mesh lists %d modules through the restarted node, want 4", len(mods))
		}
		return nil
	})
	// The restarted node's own registry mirror admits module m, and its vault fetch works.
	fctx, fcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer fcancel()
	c, err := sdk.Connect(fctx, again.ClientURL(), mSeed)
	if err != nil {
		t.Fatalf("module m connecting to the restarted node: %v", err)
	}
	defer c.Close()
	if v, err := c.Secret(fctx, "k"); err != nil || v != minted.Value {
		t.Fatalf("module m's secret through the restarted node: %q, %v", v, err)
	}

	// Every node's audit log is whole, and every event in it genuine: the servers' and the
	// vault's own events verify against the keys the mesh recorded.
	for _, name := range []string{"a", "b", "c"} {
		retryUntil(t, 30*time.Second, func() error {
			reply, err := audit.Call(fctx, opA, name, api.AuditRequest{Op: "verify"})
			if err != nil {
				return err
			}
			if v := reply.Verification; !v.OK() {
				return fmt.Errorf("node %s: broken %+v, not genuine %+v", name, v.Broken, v.Flagged)
			}
			return nil
		})
	}
}
