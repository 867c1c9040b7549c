package main

import (
	"context"
	"encoding/json"
	"fmt"
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
		Short: "List the mesh's servers: name, address, state, JetStream role, seats held",
		Example: `  meshnode members
  meshnode members --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dataDir, err := clientDataDir(cmd)
			if err != nil {
				return err
			}
			info, err := datadir.ReadInfo(dataDir)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, info.HTTPURL+"/v1/members", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("node %s does not answer on %s: %v; is it running (`meshnode status`)?", info.Name, info.HTTPURL, err)
			}
			defer resp.Body.Close()
			var ms []api.NodeMember
			if err := json.NewDecoder(resp.Body).Decode(&ms); err != nil {
				return fmt.Errorf("members: %w", err)
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), ms)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tADDRESS\tSTATE\tJETSTREAM\tSEATS")
			for _, m := range ms {
				seats := strings.Join(m.Seats, ",")
				if seats == "" {
					seats = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, m.Address, m.State, m.JetStream, seats)
			}
			return tw.Flush()
		},
	}
	addConfigFlags(cmd)
	addContextFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per member: name, address, state, jetstream, seats, client?")
	return cmd
}
