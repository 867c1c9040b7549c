//go:build integration

package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
)

// TestIntegration_Replication_ThreeFiveFour: a mesh founded with three servers keeps three
// copies of every stream it depends on — the registry, vault and leases buckets, EVENTS, DEAD,
// STATE — and every node's status shows each with its replicas and a quorum; two servers join
// and the controller's holder brings every stream to five copies; one stopped and removed
// leaves four, and every stream is back to three.
func TestIntegration_Replication_ThreeFiveFour(t *testing.T) {
	cfgs, nodes := openFounders(t, 3, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs sync.WaitGroup
	var stops []context.CancelFunc
	run := func(n *node.Node) {
		nctx, stop := context.WithCancel(ctx)
		stops = append(stops, stop)
		runs.Add(1)
		go func() { defer runs.Done(); n.Run(nctx) }()
	}
	for _, n := range nodes {
		run(n)
	}
	t.Cleanup(func() {
		cancel()
		runs.Wait()
		for _, n := range nodes {
			n.Close()
		}
	})
	mesh := []string{"KV_mesh-registry", "KV_mesh-vault", "KV_mesh-seats", manifest.EventsStreamName, manifest.DeadStreamName, manifest.StateStreamName}
	replicated := func(on []*node.Node, servers, replicas int) func() error {
		return func() error {
			for _, n := range on {
				sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
				r := n.Status(sctx).Replication
				scancel()
				if r == nil || r.Error != "" {
					return fmt.Errorf("%s's status: replication %+v", n.Identity().Name, r)
				}
				if r.Servers != servers || r.Target != replicas || r.Tolerates != (replicas-1)/2 {
					return fmt.Errorf("%s counts %d servers, %d copies, %d down tolerated; want %d, %d", n.Identity().Name, r.Servers, r.Target, r.Tolerates, servers, replicas)
				}
				got := map[string]api.StreamReplication{}
				for _, s := range r.Streams {
					got[s.Name] = s
				}
				for _, name := range mesh {
					if s, ok := got[name]; !ok || s.Replicas != replicas || s.Current != replicas || !s.Quorum {
						return fmt.Errorf("%s's status shows %s as %+v, want %d current copies with quorum", n.Identity().Name, name, s, replicas)
					}
				}
			}
			return nil
		}
	}
	retryUntil(t, 60*time.Second, replicated(nodes, 3, 3))

	// d and e join with a token.
	op := connect(t, nodes[0].ClientURL(), filepath.Join(cfgs[0].DataDir, datadir.OperatorSeedFile), nats.CustomInboxPrefix(manifest.OperatorInbox))
	defer op.Close()
	tctx, tcancel := context.WithTimeout(ctx, time.Minute)
	defer tcancel()
	var tok api.Token
	if _, err := vault.Call(tctx, op, api.VaultVerbToken, api.VaultCallerOperator, api.VaultRequest{TTL: "1h", Uses: 2}, &tok); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"d", "e"} {
		cfg := clusterConfig(t, name)
		if _, err := node.Join(tctx, cfg, tok.Token); err != nil {
			t.Fatalf("join %s: %v", name, err)
		}
		n := node.New(cfg, testLog())
		if err := n.OpenContext(tctx); err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		nodes = append(nodes, n)
		run(n)
	}
	retryUntil(t, 90*time.Second, replicated(nodes, 5, 5))

	// e stops (a dead server is what `node remove` takes), then is removed through a.
	stops[4]()
	nodes[4].Close()
	body, _ := json.Marshal(api.ClusterRequest{Node: "e"})
	retryUntil(t, 60*time.Second, func() error {
		m, err := op.Request(manifest.NodeToolSubject("a", api.NodeToolRemove), body, 10*time.Second)
		if err != nil {
			return err
		}
		var reply api.ClusterReply
		if err := json.Unmarshal(m.Data, &reply); err != nil || !reply.OK {
			return fmt.Errorf("remove e: %s (%v)", m.Data, err)
		}
		return nil
	})
	retryUntil(t, 90*time.Second, replicated(nodes[:4], 4, 3))
}
