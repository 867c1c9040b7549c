package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/formats"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/site"
	"github.com/spf13/cobra"
)

// joinSite is `join --leaf`: it enrols the data dir as a site of the mesh the join token
// names, then runs it (or, with noRun, says how to start it).
func joinSite(cmd *cobra.Command, cfg config.Config, token string, noRun bool) error {
	if err := siteClientAddr(cfg); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
	j, err := site.Join(ctx, cfg, token)
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "site %s enrolled in mesh %s; its hub: %v\n", j.Name, j.MeshID, j.Hub)
	if kept, err := keepAddresses(cmd, cfg); err != nil {
		return err
	} else if kept != "" {
		fmt.Fprintf(cmd.OutOrStdout(), "its addresses are kept in %s\n", kept)
	}
	return runOrHandOff(cmd, cfg, noRun)
}

// siteClientAddr refuses a site's client port beyond loopback: a site serves the modules of
// its own machine, without TLS (not built yet).
func siteClientAddr(cfg config.Config) error {
	host, _, err := net.SplitHostPort(cfg.ClientAddr)
	if err != nil || !meshca.Loopback(host) {
		return fmt.Errorf("%w: client-addr %q: a site serves the modules of its own machine on loopback (TLS on a site's client port is not built yet); set --client-addr 127.0.0.1:4222", config.ErrInvalid, cfg.ClientAddr)
	}
	return nil
}

// runSite runs the site held in cfg's data dir until a signal.
func runSite(cmd *cobra.Command, cfg config.Config, held *site.Held, log *slog.Logger) error {
	defer held.Close()
	if err := siteClientAddr(cfg); err != nil {
		return err
	}
	hubTLS, err := held.TLS()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	s, err := site.Open(ctx, site.Config{Name: held.Name, StoreDir: filepath.Join(cfg.DataDir, datadir.JetStreamDir),
		ClientAddr: cfg.ClientAddr, Key: held.Key, HubURLs: held.Hub, HubTLS: hubTLS,
		EventsMaxBytes: int64(cfg.EventsMaxBytes), DB: held.Store(), Log: log})
	if err != nil {
		if ctx.Err() != nil {
			return nil // a requested stop
		}
		return err
	}
	defer s.Close()
	// node.json, as a node writes it: the CLI on this machine finds the site's client port
	// with --data-dir (meshnode audit query --data-dir DIR --creds operator.nk).
	info := datadir.Info{Name: held.Name, MeshID: held.MeshID, PID: os.Getpid(), Version: formats.MeshnodeVersion(),
		ClientURL: s.Bus().ClientURL(), Started: time.Now().UTC()}
	if err := datadir.WriteInfo(cfg.DataDir, info); err != nil {
		return fmt.Errorf("write %s: %w", datadir.InfoFile, err)
	}
	defer datadir.RemoveInfo(cfg.DataDir)
	fmt.Fprintf(cmd.OutOrStdout(), "meshnode ready: site %s of mesh %s, client %s, hub %v (linked: %v)\n",
		held.Name, held.MeshID, s.Bus().ClientURL(), held.Hub, s.Bus().Linked())
	sdNotify("READY=1\nSTATUS=ready: site " + held.Name + ", mesh " + held.MeshID)
	<-ctx.Done()
	log.Info("stopping", "reason", "signal")
	return nil
}
