package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/node"
	"github.com/spf13/cobra"
)

func newUpCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a single node on this machine, on loopback, creating it on first run",
		Long: `Run a single node on this machine, everything on loopback: the quickest way to try
meshnode. On an empty data dir (default ./meshnode-data) it creates the node and its mesh;
later runs restart the same node with its data.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runNode(cmd, config.Up(), true)
		},
	}
	addNodeFlags(cmd, config.Up())
	return cmd
}

func newRunCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run this machine's node as a service (the systemd unit runs this)",
		Long: `Run an existing node as a service: listening on every interface, data in
/var/lib/meshnode by default. The data dir must already hold a node (made by up).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runNode(cmd, config.Run(), false)
		},
	}
	addNodeFlags(cmd, config.Run())
	return cmd
}

// runNode opens a node, announces it, and runs it until a signal.
func runNode(cmd *cobra.Command, defaults config.Config, create bool) error {
	cfg, err := loadConfig(cmd, defaults)
	if err != nil {
		return err
	}
	// Catch SIGINT and SIGTERM from here on: a signal that arrived between the ready line and
	// the run loop would otherwise kill the process with the default action.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := newLogger(cfg, os.Stderr)
	n := node.New(cfg, log)
	n.CreateIdentity = create
	if err := n.Open(); err != nil {
		if errors.Is(err, node.ErrNoIdentity) {
			return fmt.Errorf("%w; `meshnode run` starts an existing node: create a mesh with `meshnode genesis --data-dir %s --name %s` (or try one with `meshnode up`)", err, cfg.DataDir, cfg.Name)
		}
		return err
	}
	defer n.Close()

	id := n.Identity()
	fmt.Fprintf(cmd.OutOrStdout(), "meshnode ready: node %s, mesh %s, client %s, http %s\n",
		id.Name, id.MeshID, n.ClientURL(), n.HTTPURL())
	fmt.Fprintf(cmd.OutOrStdout(), "  try: meshnode status --data-dir %s\n", cfg.DataDir)
	sdNotify("READY=1")
	err = n.Run(ctx)
	if ctx.Err() != nil {
		log.Info("stopping", "reason", "signal")
	}
	sdNotify("STOPPING=1")
	return err
}
