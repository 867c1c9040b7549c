package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func newLeaveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "leave",
		Short:   "Take the node running on --data-dir out of its mesh for good, gracefully",
		Example: `  meshnode leave --data-dir /var/lib/meshnode`,
		Long: `Take this node out of its mesh: it announces it, hands the seats it holds to other
servers, says goodbye to the gossip, has the JetStream meta leader remove it as a peer, and
stops. The data dir then refuses to run; to bring the machine back, join it again with a
fresh data dir and a new token. Refused when fewer than 3 servers would remain.

To stop a node for a while (a reboot, an upgrade), stop its service instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, err := runningNode(cmd)
			if err != nil {
				return err
			}
			if err := clusterTool(cmd, info.Name, api.NodeToolLeave, api.ClusterRequest{}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s left mesh %s and is stopping\n", info.Name, info.MeshID)
			return nil
		},
	}
	addClientFlags(cmd)
	return cmd
}

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Administer the mesh's servers"}
	remove := &cobra.Command{
		Use:     "remove NAME",
		Short:   "Remove a dead server from the mesh (JetStream never removes one by itself)",
		Example: `  meshnode node remove c`,
		Long: `Remove a server that died for good: the node running on --data-dir asks the
JetStream meta leader to drop it as a peer ($JS.API.SERVER.REMOVE) and forgets its keys, so
the vault hands it nothing more. Refused while the server still answers gossip: stop it
first, or run meshnode leave on it.`,
		Args: namedArgs(cobra.ExactArgs(1), argNode),
		RunE: func(cmd *cobra.Command, args []string) error {
			info, err := runningNode(cmd)
			if err != nil {
				return err
			}
			if err := clusterTool(cmd, info.Name, api.NodeToolRemove, api.ClusterRequest{Node: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "server %s removed from mesh %s\n", args[0], info.MeshID)
			return nil
		},
	}
	addClientFlags(remove)
	accept := &cobra.Command{
		Use:   "accept-loss BUCKET",
		Short: "Accept that the mesh's registry or vault bucket was lost, and clear the alarm",
		Long: `When the mesh-registry or mesh-vault bucket is deleted, every node's /readyz says 503
and names it: nodes never recreate those buckets empty on their own, because an empty
registry is not an empty mesh. Restore the bucket from a backup, or re-register the modules
(and mint their secrets again), then accept the loss with this verb: the bucket gets its
marker back and the alarm clears on every node within seconds.`,
		Example: `  meshnode node accept-loss mesh-registry`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			info, err := runningNode(cmd)
			if err != nil {
				return err
			}
			if err := clusterTool(cmd, info.Name, api.NodeToolAcceptLoss, api.AcceptLossRequest{Bucket: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "the loss of %s is accepted; the alarm clears on every node within seconds\n", args[0])
			return nil
		},
	}
	addClientFlags(accept)
	cmd.AddCommand(remove, accept)
	return cmd
}

// runningNode reads node.json of the node on --data-dir.
func runningNode(cmd *cobra.Command) (datadir.Info, error) {
	dir, err := clientDataDir(cmd)
	if err != nil {
		return datadir.Info{}, err
	}
	return datadir.ReadInfo(dir)
}

// clusterTool asks the node named for one of its cluster tools, as the operator.
func clusterTool(cmd *cobra.Command, name, tool string, req any) error {
	return withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
		body, _ := json.Marshal(req)
		msg, err := nc.RequestWithContext(ctx, manifest.NodeToolSubject(name, tool), body)
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("node %s does not answer %s: it is a single node, or not running", name, tool)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", tool, err)
		}
		var r api.ClusterReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			return fmt.Errorf("%s: answer %q: %w", tool, msg.Data, err)
		}
		if !r.OK {
			return errors.New(r.Error)
		}
		return nil
	})
}
