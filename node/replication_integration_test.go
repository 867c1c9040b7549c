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
)

// TestIntegration_Replication_FiveThenFour: a mesh founded with five servers keeps five copies
// of every stream it depends on — the registry, vault and leases buckets, EVENTS, DEAD, STATE —
// and every node's status shows each with its replicas and a quorum; one server stopped and
// removed leaves four, and the controller's holder brings every stream to three copies.
func TestIntegration_Replication_FiveThenFour(t *testing.T) {
	cfgs, nodes := openFounders(t, 5, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs sync.WaitGroup
	stops := make([]context.CancelFunc, len(nodes))
	for i, n := range nodes {
		nctx, stop := context.WithCancel(ctx)
		stops[i] = stop
		runs.Add(1)
		go func() { defer runs.Done(); n.Run(nctx) }()
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
	retryUntil(t, 60*time.Second, replicated(nodes, 5, 5))

	// e stops (a dead server is what `node remove` takes), then is removed through a.
	stops[4]()
	nodes[4].Close()
	op := connect(t, nodes[0].ClientURL(), filepath.Join(cfgs[0].DataDir, datadir.OperatorSeedFile))
	defer op.Close()
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
