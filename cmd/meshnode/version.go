package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"runtime"
	"slices"

	"github.com/meshnode/meshnode/formats"

	"github.com/spf13/cobra"
)

// versionReport is what `meshnode version --json` prints.
type versionReport struct {
	Version   string                     `json:"version"`
	GoVersion string                     `json:"go_version"`
	Formats   map[string]formats.Version `json:"formats"`
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the meshnode version and the formats it writes and reads",
		Long: `Print the meshnode version, the Go version it was built with, and for each persistent
format and the wire protocol the version this binary writes and the oldest it reads. Two
meshnode versions may run in one mesh while each reads what the other writes
(docs/operations.md, Upgrades). With --json, formats maps each format's name to its
writes and reads_from.`,
		Example: `  meshnode version
  meshnode version --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := versionReport{Version: formats.MeshnodeVersion(), GoVersion: runtime.Version(), Formats: formats.All()}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(r)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintln(w, "meshnode", r.Version, r.GoVersion)
			for _, name := range slices.Sorted(maps.Keys(r.Formats)) {
				f := r.Formats[name]
				fmt.Fprintf(w, "format %s: writes %d, reads %d to %d\n", name, f.Writes, f.ReadsFrom, f.Writes)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object (formats: by name, writes and reads_from): version, go_version, formats")
	return cmd
}
