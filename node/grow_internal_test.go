package node

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/membership"
)

// TestGrower_Close: nothing a grower starts outlives its close. close ends the count of
// members and waits for it, and a grower closed while its gossip opens (a grow request
// racing the node's Close) stops that gossip and starts no count.
func TestGrower_Close(t *testing.T) {
	t.Parallel()
	gossip := func(kick func()) (*membership.Membership, error) {
		return membership.Open(membership.Config{
			Meta:      membership.Meta{Name: "a", MeshID: "m"},
			BindAddr:  "127.0.0.1:0",
			GossipKey: make([]byte, 32),
			OnChange:  func(membership.Member) { kick() },
		})
	}

	t.Run("open", func(t *testing.T) {
		var g grower
		counts := make(chan struct{}, 8)
		count := func() { counts <- struct{}{} }
		if err := g.open(gossip, count); err != nil {
			t.Fatal(err)
		}
		select {
		case <-counts:
		case <-time.After(10 * time.Second):
			t.Fatal("the members were not counted once the gossip opened")
		}
		// Again (a second grow request): the same growth, nothing more started.
		if err := g.open(func(func()) (*membership.Membership, error) {
			t.Error("a second open started a second gossip")
			return nil, nil
		}, count); err != nil {
			t.Fatal(err)
		}
		if err := g.close(); err != nil {
			t.Fatal(err)
		}
		if g.gossip != nil {
			t.Fatal("the gossip is still the grower's after close")
		}
	})

	t.Run("closed while opening", func(t *testing.T) {
		var g grower
		err := g.open(func(kick func()) (*membership.Membership, error) {
			m, err := gossip(kick)
			if cerr := g.close(); cerr != nil {
				t.Errorf("close while the gossip opens: %v", cerr)
			}
			return m, err
		}, func() { t.Error("the members were counted after close") })
		if err == nil {
			t.Fatal("open after close: no error, want the node closing")
		}
		if g.gossip != nil {
			t.Fatal("a gossip opened after close is the grower's")
		}
	})
}
