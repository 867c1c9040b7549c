package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/dashboard"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/meshca"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"
)

func newUICmd() *cobra.Command {
	var readOnly bool
	var httpURL string
	cmd := &cobra.Command{
		Use:   "ui [--read-only]",
		Short: "Print a one-time link that logs a browser in to the node's dashboard",
		Long: `Print a one-time link to the dashboard of a node: the one running on --data-dir, or the
one whose client port --server, MESHNODE_SERVER or a context names. The node gives a
challenge (over its HTTP address, or over the bus to a node named by server), this signs
it with the operator's seed (--creds, default <data-dir>/operator.nk), and the node checks
the signature against the operator's registered key: no password exists, and nothing
secret travels in a stream. The link works once, within a minute, and the browser's
session lasts 12 hours. An operator session may also replay and drop dead letters;
--read-only makes one that only sees.

The dashboard is served on the node's HTTP address (http-addr, loopback by default): reach
a remote node's through an SSH tunnel and pass the tunnel's end as --http. A node whose
http-addr is beyond loopback serves HTTPS with its certificate from the mesh's CA: the
browser must trust the CA (ca.pem in every data dir), and this trusts it with --ca or the
data dir's.`,
		Example: `  meshnode ui --data-dir /var/lib/meshnode
  meshnode ui --read-only --data-dir /var/lib/meshnode
  # a remote node: ssh -L 8222:127.0.0.1:8222 host, then
  meshnode ui --server tls://host:4222 --creds operator.nk --ca ca.pem --http http://127.0.0.1:8222`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			remote, err := byServer(cmd)
			if err != nil {
				return err
			}
			if remote {
				return uiByBus(cmd, httpURL, readOnly)
			}
			var want dashboard.Challenge // the node meant, when the data dir says
			creds, err := firstSet(cmd, "creds", envCreds, func(c *cliContext) string { return c.Creds })
			if err != nil {
				return err
			}
			if httpURL == "" || creds == "" {
				dir, err := clientDataDir(cmd)
				if err != nil {
					return err
				}
				if httpURL == "" {
					info, err := datadir.ReadInfo(dir)
					if err != nil {
						return fmt.Errorf("%w; or pass --http URL, or name the node with --server URL", err)
					}
					httpURL, want = info.HTTPURL, dashboard.Challenge{Node: info.Name, MeshID: info.MeshID}
				}
				if creds == "" {
					creds = filepath.Join(dir, datadir.OperatorSeedFile)
				}
			}
			key, err := operatorKey(creds)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			// A node serving HTTP beyond loopback serves HTTPS with the mesh's CA (--ca, or
			// the data dir's).
			client := meshca.HTTPClient(nil)
			if ca := clientCA(cmd); ca != "" {
				pool, err := meshca.RootCAs(ca)
				if err != nil {
					return err
				}
				client = meshca.HTTPClient(pool)
			}
			link, err := dashboard.LoginLink(ctx, client, httpURL, key, readOnly, want)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), link)
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "a session that sees, and may not act")
	cmd.Flags().StringVar(&httpURL, "http", "", "the node's HTTP address as this machine reaches it (default: the node's own http-addr, from its node.json or its ui tool)")
	return cmd
}

// uiByBus prints a login link for the node the verb names by server: the challenge comes
// over the bus from the node's ui tool, so only the browser needs the node's HTTP address
// (httpURL, a tunnel's end; default the node's own).
func uiByBus(cmd *cobra.Command, httpURL string, readOnly bool) error {
	var ch api.UIChallenge
	if err := askNode(cmd, api.NodeToolUI, &ch); err != nil {
		return err
	}
	server, creds, err := clientTarget(cmd)
	if err != nil {
		return err
	}
	key, err := operatorKey(creds)
	if err != nil {
		return err
	}
	if httpURL == "" {
		httpURL = ch.HTTPURL
	}
	link, err := dashboard.SignLogin(httpURL, key, readOnly, dashboard.Challenge{Node: ch.Node, MeshID: ch.MeshID, Nonce: ch.Nonce})
	if err != nil {
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), link)
	// A loopback address of another machine: the browser here needs a tunnel to it.
	su, _ := url.Parse(server)
	if u, err := url.Parse(httpURL); err == nil && su != nil && isLoopback(u.Hostname()) && !isLoopback(su.Hostname()) && !cmd.Flags().Changed("http") {
		fmt.Fprintf(cmd.ErrOrStderr(), "node %s's dashboard listens on %s on its own machine: open the link through a tunnel to it (ssh -L %s:%s HOST), or pass --http with the tunnel's end\n",
			ch.Node, u.Host, u.Port(), u.Host)
	}
	return nil
}

// operatorKey reads the operator's seed in creds.
func operatorKey(creds string) (nkeys.KeyPair, error) {
	raw, err := readBounded(creds, "seed file", maxSeedBytes)
	if err != nil {
		return nil, fmt.Errorf("read the operator's seed: %w; pass --creds FILE", err)
	}
	key, err := nkeys.ParseDecoratedNKey(raw)
	if err != nil {
		return nil, fmt.Errorf("%s holds no nkey seed: %w", creds, err)
	}
	return key, nil
}

// isLoopback reports whether host names this machine's loopback.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
