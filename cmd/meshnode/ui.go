package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshnode/meshnode/dashboard"
	"github.com/meshnode/meshnode/datadir"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"
)

func newUICmd() *cobra.Command {
	var readOnly bool
	var httpURL, creds string
	cmd := &cobra.Command{
		Use:   "ui [--read-only]",
		Short: "Print a one-time link that logs a browser in to the node's dashboard",
		Long: `Print a one-time link to the dashboard of the node running on --data-dir. The node gives a
challenge, this signs it with the operator's seed, and the node checks the signature against
the operator's registered key: no password exists, and nothing secret travels in a stream.
The link works once, within a minute, and the browser's session lasts 12 hours. An operator
session may also replay and drop dead letters; --read-only makes one that only sees.

The dashboard is served on the node's HTTP address (http-addr, loopback by default): reach
a remote node's through an SSH tunnel rather than binding http-addr to other interfaces.`,
		Example: `  meshnode ui --data-dir /var/lib/meshnode
  meshnode ui --read-only --data-dir /var/lib/meshnode
  # a remote node: ssh -L 8222:127.0.0.1:8222 host, then
  meshnode ui --http http://127.0.0.1:8222 --creds operator.nk`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var want dashboard.Challenge // the node meant, when the data dir says
			if httpURL == "" || creds == "" {
				dir, err := clientDataDir(cmd)
				if err != nil {
					return err
				}
				if httpURL == "" {
					info, err := datadir.ReadInfo(dir)
					if err != nil {
						return fmt.Errorf("%w; or pass --http URL", err)
					}
					httpURL, want = info.HTTPURL, dashboard.Challenge{Node: info.Name, MeshID: info.MeshID}
				}
				if creds == "" {
					creds = filepath.Join(dir, datadir.OperatorSeedFile)
				}
			}
			raw, err := os.ReadFile(creds)
			if err != nil {
				return fmt.Errorf("read the operator's seed: %w; pass --creds FILE", err)
			}
			key, err := nkeys.ParseDecoratedNKey(raw)
			if err != nil {
				return fmt.Errorf("%s holds no nkey seed: %w", creds, err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			link, err := dashboard.LoginLink(ctx, httpURL, key, readOnly, want)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), link)
			return nil
		},
	}
	addConfigFlags(cmd)
	addContextFlag(cmd)
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "a session that sees, and may not act")
	cmd.Flags().StringVar(&httpURL, "http", "", "the node's HTTP address (default: the node running on --data-dir, from its node.json)")
	cmd.Flags().StringVar(&creds, "creds", "", "the operator's seed file (default: <data-dir>/operator.nk)")
	return cmd
}
