//go:build integration

package node_test

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/formats"
	"github.com/meshnode/meshnode/node"
)

// TestIntegration_FormatsSwitchOnceEveryServerIsUpgraded is issue 39's rule for a rolling
// upgrade, with a stand-in newer meshnode that writes version 2 of the declaration: while any
// server runs the older binary the mesh's servers agree on version 1, so no one is sent what
// it cannot read; once the last server is upgraded they switch to 2, and the audit log of
// every server records the switch once (the node event format-switched, which each server that
// saw the older agreement publishes under one Nats-Msg-Id). Servers without a version in common: TestWatcher_ReportsNoCommonVersion.
func TestIntegration_FormatsSwitchOnceEveryServerIsUpgraded(t *testing.T) {
	c := newCluster(t)
	newer := maps.Clone(formats.All())
	newer[formats.Declaration] = formats.Version{ReadsFrom: 1, Writes: 2}
	agreed := func(i int, want int) func() error {
		return func() error {
			st := c.nodes[i].Status(c.ctx())
			if st.FormatsError != "" || st.Formats[formats.Declaration] != want {
				return fmt.Errorf("%s agrees on %v (%q), want declaration %d", c.cfgs[i].Name, st.Formats, st.FormatsError, want)
			}
			return nil
		}
	}
	for i := range c.nodes {
		retryUntil(t, 20*time.Second, agreed(i, 1))
	}
	upgrade := func(i int) {
		t.Helper()
		c.stop(i)
		n := node.New(c.cfgs[i], testLog())
		n.Formats = newer
		if err := n.Open(); err != nil {
			t.Fatalf("reopen %s on the newer formats: %v", c.cfgs[i].Name, err)
		}
		c.nodes[i] = n
		c.run(i)
	}
	upgrade(0)
	upgrade(1)
	for i := range c.nodes {
		// c, on the older binary, keeps the mesh on version 1: give the gossip time to show
		// a and b upgraded before looking.
		retryUntil(t, 20*time.Second, func() error {
			for _, m := range c.nodes[i].Status(c.ctx()).Members {
				if m.State != "alive" {
					return fmt.Errorf("%s sees %s %s", c.cfgs[i].Name, m.Name, m.State)
				}
			}
			return nil
		})
		if err := agreed(i, 1)(); err != nil {
			t.Fatalf("two of three servers upgraded: %v", err)
		}
	}
	upgrade(2)
	for i := range c.nodes {
		retryUntil(t, 30*time.Second, agreed(i, 2))
	}
	for i, n := range c.nodes {
		name := n.Identity().Name
		retryUntil(t, 30*time.Second, func() error {
			reply, err := audit.Call(c.ctx(), c.op, name, api.AuditRequest{Op: "query", Filter: api.AuditFilter{Event: "node.*.format-switched"}})
			if err != nil {
				return err
			}
			if len(reply.Records) != 1 || !reply.Records[0].Signed {
				return fmt.Errorf("%s's audit log has %d format-switched records, want 1, signed: %+v", c.cfgs[i].Name, len(reply.Records), reply.Records)
			}
			return nil
		})
	}
	c.auditGenuine()
}
