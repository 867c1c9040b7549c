package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

// The build cascade's verbs: what a post-receive hook runs, and the list of builds.

func newGitCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "git", Short: "The mesh-git seat's repositories"}
	cmd.AddCommand(newGitNotifyCmd())
	return cmd
}

func newGitNotifyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "notify REPOSITORY",
		Short:   "Tell this node's mesh-git holder that a repository changed (a post-receive hook runs it)",
		Example: `  meshnode git notify shop   # in the repository's post-receive hook`,
		Long: `Tell this node that a repository it serves (git-repos) changed, so a new commit becomes a
pushed event at once instead of at the next periodic check (every 30 s). Install it as the
repository's hooks/post-receive:

  #!/bin/sh
  exec meshnode git notify shop --data-dir /var/lib/meshnode`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dataDir, err := clientDataDir(cmd)
			if err != nil {
				return err
			}
			info, err := datadir.ReadInfo(dataDir)
			if err != nil {
				return err
			}
			return withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
				b, _ := json.Marshal(map[string]string{"repository": args[0]})
				msg, err := nc.RequestWithContext(ctx, manifest.NodeToolSubject(info.Name, build.GitNotifyTool), b)
				if err != nil {
					return fmt.Errorf("ask node %s: %w", info.Name, err)
				}
				var reply api.GitReply
				if err := json.Unmarshal(msg.Data, &reply); err != nil {
					return err
				}
				if reply.Error != "" {
					return fmt.Errorf("node %s: %s", info.Name, reply.Error)
				}
				return nil
			})
		},
	}
	addClientFlags(cmd)
	return cmd
}

func newBuildsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "builds",
		Short: "The build cascade's latest builds: module, status, version, trigger",
		Example: `  meshnode builds
  meshnode builds --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var builds []api.Build
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				builds, err = admin.Builds(ctx, nc)
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), builds)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "MODULE\tSTATUS\tVERSION\tSTARTED\tTOOK\tTRIGGER\tREASON")
			for _, b := range builds {
				took := "-"
				if !b.Finished.IsZero() && !b.Started.IsZero() {
					took = b.Finished.Sub(b.Started).Truncate(time.Millisecond).String()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", b.Module, b.Status, b.Version, b.Started.Format(time.RFC3339), took, b.Trigger, b.Reason)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per build: module, status, commit, started, trigger, cascade, cause, version?, digest?, finished?, reason?")
	addClientFlags(cmd)
	return cmd
}
