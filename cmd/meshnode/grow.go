package main

import (
	"encoding/json"
	"fmt"
	"net"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/vault"
	"github.com/spf13/cobra"
)

func newGrowCmd() *cobra.Command {
	var expect int
	ttl := config.Duration(vault.DefaultTokenTTL)
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "grow --expect N",
		Short: "Grow the single node running on --data-dir into a mesh of N servers",
		Long: `Grow a single node into a mesh of N servers (3 or more). The node starts gossiping and
this prints a join token good for the N-1 new servers; on each new machine run
meshnode join with it. Once all N are alive the single node restarts: it takes a snapshot of
every stream, KV bucket and object store, starts clustered with the new servers, restores
each one, checks its message count and sequences against the snapshot, and scales it to 3
replicas. The new servers wait for it, then open. Modules, secrets, seats, the audit log
and every module's credentials stay as they were.

Progress is in meshnode status and /readyz. An interrupted growth goes on at the next start:
while it snapshots, from the untouched store; while it restores, keeping what is restored.
Give it disk for one copy of the store (<data-dir>/grow, removed when done).`,
		Example: `  meshnode grow --expect 3 --data-dir /var/lib/meshnode
  # then, on each of the two new machines:
  MESHNODE_TOKEN=MNJ1.… meshnode join --data-dir /var/lib/meshnode --name b \
    --cluster-addr 10.0.0.3:6222 --gossip-addr 10.0.0.3:7946`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if expect < 3 || expect > maxExpect {
				return usagef("--expect %d: a mesh grows to 3 to %d servers", expect, maxExpect)
			}
			info, err := runningNode(cmd)
			if err != nil {
				return err
			}
			if err := clusterTool(cmd, info.Name, api.NodeToolGrow, api.GrowRequest{Expect: expect}); err != nil {
				return err
			}
			var t api.Token
			if _, err := vaultCall(cmd, api.VaultVerbToken, api.VaultRequest{TTL: time.Duration(ttl).String(), Uses: expect - 1}, &t); err != nil {
				return fmt.Errorf("node %s is growing, but its join token was not made (%w); make one with `meshnode token create --uses %d`", info.Name, err, expect-1)
			}
			if onLoopback(info.ClusterAddr) && onLoopback(info.GossipAddr) {
				// The token's seed is this address: a joiner on another machine would wait for ever.
				fmt.Fprintf(cmd.ErrOrStderr(), "note: node %s listens on loopback only (cluster %s, gossip %s): only servers on this machine can join it; to grow across machines, restart it with --cluster-addr and --gossip-addr (or --advertise) the new machines reach, then run grow again\n",
					info.Name, info.ClusterAddr, info.GossipAddr)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"token": t.Token, "id": t.ID, "expires": t.Expires, "uses": t.Uses, "expect": expect})
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.Token)
			fmt.Fprintf(cmd.ErrOrStderr(), "node %s waits for %d more server(s); join each with this token (%d uses, expires %s), a bearer credential — hand it over privately\n",
				info.Name, expect-1, t.Uses, t.Expires.Format(time.RFC3339))
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().IntVar(&expect, "expect", 0, "the servers of the mesh, this one included (3 to 64)")
	cmd.Flags().Var(&ttl, "ttl", "how long the join token is valid (e.g. 1h, 7d)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: token, id, expires, uses, expect")
	return cmd
}

// onLoopback reports whether addr (host:port) is on a loopback address or localhost.
func onLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && meshca.Loopback(host)
}
