package main

import (
	"fmt"
	"runtime"

	"github.com/meshnode/meshnode/node"

	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the meshnode version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "meshnode", node.Version(), runtime.Version())
			return nil
		},
	}
}
