package node_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/node"
)

// clusterConfig is a node's configuration with fixed loopback ports for routes and gossip
// (the others must know them before the bus starts).
func clusterConfig(t testing.TB, name string) config.Config {
	c := testConfig(t.TempDir(), name)
	c.ClusterAddr = testbed.FreeAddr(t)
	c.GossipAddr = testbed.FreeAddr(t)
	return c
}

// openThree prepares a (genesis --expect 3) and b, c (the founding token), and opens the
// three nodes at once; it returns when all three are open. The caller runs and closes them.
func openThree(t testing.TB) ([]config.Config, []*node.Node) { return openThreeWith(t, nil) }

// openThreeWith is openThree with each node's configuration changed by tweak first.
func openThreeWith(t testing.TB, tweak func(i int, c *config.Config)) ([]config.Config, []*node.Node) {
	return openFounders(t, 3, tweak)
}

// openFounders is openThreeWith for a mesh founded with count servers, named a, b, c, ….
func openFounders(t testing.TB, count int, tweak func(i int, c *config.Config)) ([]config.Config, []*node.Node) {
	cfgs := make([]config.Config, count)
	for i := range cfgs {
		cfgs[i] = clusterConfig(t, string(rune('a'+i)))
		if tweak != nil {
			tweak(i, &cfgs[i])
		}
	}
	f, _, err := datadir.Prepare(cfgs[0], count)
	if err != nil {
		t.Fatal(err)
	}
	token := f.FoundingToken(count, []string{cfgs[0].GossipAddr})
	for _, c := range cfgs[1:] {
		if _, err := node.Found(c, token); err != nil {
			t.Fatal(err)
		}
	}
	nodes := make([]*node.Node, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i, c := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := node.New(c, testLog())
			errs[i] = n.Open()
			nodes[i] = n
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for _, n := range nodes {
				if n != nil {
					n.Close()
				}
			}
			t.Fatalf("node %s: %v", cfgs[i].Name, err)
		}
	}
	return cfgs, nodes
}

func testLog() *slog.Logger {
	if os.Getenv("MESHNODE_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// TestCluster_FormationCanBeCancelled: a founding node alone waits for the others, and a
// cancelled wait leaves nothing running.
func TestCluster_FormationCanBeCancelled(t *testing.T) {
	t.Parallel()
	cfg := clusterConfig(t, "lonely")
	if _, _, err := datadir.Prepare(cfg, 3); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	n := node.New(cfg, testLog())
	err := n.OpenContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "1 of 3 servers met") {
		t.Fatalf("open alone: %v", err)
	}
	// The gossip address is free again.
	l, lerr := net.ListenPacket("udp", cfg.GossipAddr)
	if lerr != nil {
		t.Fatalf("gossip address still taken: %v", lerr)
	}
	l.Close()
}
