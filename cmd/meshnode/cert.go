package main

import (
	"fmt"

	"github.com/meshnode/meshnode/api"
	"github.com/spf13/cobra"
)

func newCertCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cert", Short: "The node's TLS certificate, from the mesh's CA"}
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Give the node running on --data-dir a new certificate, without a restart",
		Long: `Issue the node a new certificate from the mesh's CA (for its name, loopback, and the hosts
of its cluster, client and advertise addresses; valid 90 days) and present it from the next
TLS handshake on: routes and clients connected keep their connections. A node also renews
its certificate by itself at start once a third of its life is left, or when its addresses
changed. The mesh's CA certificate, which clients trust, is <data-dir>/ca.pem.`,
		Example: `  meshnode cert rotate --data-dir /var/lib/meshnode`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, err := runningNode(cmd)
			if err != nil {
				return err
			}
			if err := clusterTool(cmd, info.Name, api.NodeToolCertRotate, struct{}{}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s has a new certificate; new connections see it\n", info.Name)
			return nil
		},
	}
	addClientFlags(rotate)
	cmd.AddCommand(rotate)
	return cmd
}
