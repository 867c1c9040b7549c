package main

import (
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/meshnode/meshnode/node"

	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the meshnode version",
		Example: `  meshnode version
  meshnode version --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]string{"version": node.Version(), "go_version": runtime.Version()})
			}
			fmt.Fprintln(cmd.OutOrStdout(), "meshnode", node.Version(), runtime.Version())
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: version, go_version")
	return cmd
}
