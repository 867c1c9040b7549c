package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/spf13/cobra"
)

func newMembersCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "members [--json]",
		Short: "List the mesh's servers: name, client URL, state, JetStream role, meshnode version, seats held",
		Long: `List the mesh's servers as the node asked sees them. CLIENT URL (JSON: address) is where
a module or ` + "`meshnode --server`" + ` connects to the server, on a single node and in a mesh
alike; GOSSIP (JSON: gossip_addr) is its membership gossip's host:port, "-" on a single node.
VERSION is the server's meshnode version, as its gossip tells it: "?" for a meshnode older
than version reporting. During a rolling upgrade the mesh shows two.

The node asked is the one running on --data-dir, or the one whose client port --server,
MESHNODE_SERVER or a context names (asked over its bus as the operator: --creds).`,
		Example: `  meshnode members
  meshnode members --json
  meshnode members --server tls://10.0.0.2:4222 --creds operator.nk --ca ca.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ms, err := askMembers(cmd)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), ms)
			}
			return printMembers(cmd.OutOrStdout(), ms)
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per member (address is its client URL; version is absent for a meshnode older than version reporting): name, address, gossip_addr?, state, jetstream, seats, version?")
	return cmd
}

// askMembers asks the node the verb names for the mesh's members: over the bus when it is
// named by server, else over the HTTP API of the node running on the data dir.
func askMembers(cmd *cobra.Command) ([]api.NodeMember, error) {
	remote, err := byServer(cmd)
	if err != nil {
		return nil, err
	}
	if remote {
		var reply api.NodeMembersReply
		return reply.Members, askNode(cmd, api.NodeToolMembers, &reply)
	}
	dataDir, err := clientDataDir(cmd)
	if err != nil {
		return nil, err
	}
	info, err := datadir.ReadInfo(dataDir)
	if err != nil {
		return nil, fmt.Errorf("%w; or name the node with --server URL --creds FILE", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, info.HTTPURL+"/v1/members", nil)
	resp, err := nodeHTTP(dataDir).Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s does not answer on %s: %v; is it running (`meshnode status`)?", info.Name, info.HTTPURL, err)
	}
	defer resp.Body.Close()
	var ms []api.NodeMember
	if err := json.NewDecoder(resp.Body).Decode(&ms); err != nil {
		return nil, fmt.Errorf("node %s answered %s with no list of members: %w", info.Name, resp.Status, err)
	}
	return ms, nil
}

func printMembers(w io.Writer, ms []api.NodeMember) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCLIENT URL\tGOSSIP\tSTATE\tJETSTREAM\tVERSION\tSEATS")
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, orDash(m.Address), orDash(m.GossipAddr), m.State, m.JetStream, cmp.Or(m.Version, "?"), orDash(strings.Join(m.Seats, ",")))
	}
	return tw.Flush()
}

// orDash is s, or "-" for a table's empty cell.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
