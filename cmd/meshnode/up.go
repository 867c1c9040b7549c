package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/heapfloor"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/site"
	"github.com/meshnode/meshnode/vault"
	"github.com/spf13/cobra"
)

func newUpCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a single node on this machine, on loopback, creating it on first run",
		Example: `  meshnode up
  meshnode up --data-dir ./mesh --http-addr 127.0.0.1:8422`,
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
		Use:     "run",
		Short:   "Run this machine's node as a service (the systemd unit runs this)",
		Example: `  meshnode run --data-dir /var/lib/meshnode   # what the systemd unit runs`,
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

func newJoinCmd() *cobra.Command {
	var token, tokenFile string
	var noRun, leaf bool
	cmd := &cobra.Command{
		Use:   "join (--token-file FILE | MESHNODE_TOKEN=…) --data-dir DIR --name NAME [--leaf] [--no-run]",
		Short: "Join a mesh with a token, then run this node (or exit, with --no-run)",
		Example: `  meshnode join --token-file /root/token --data-dir /var/lib/meshnode --name b --cluster-addr 10.0.0.3:6222 --gossip-addr 10.0.0.3:7946
  MESHNODE_TOKEN=MNJ1.… meshnode join --data-dir /var/lib/meshnode --name c
  sudo -u meshnode meshnode join --no-run --token-file /dev/stdin --data-dir /var/lib/meshnode --name d < /root/token
  sudo systemctl enable --now meshnode   # after --no-run: the service runs the node
  meshnode join --leaf --token-file token --data-dir ./oslo --name oslo --client-addr 127.0.0.1:4222   # a site`,
		Long: `Join this node to a mesh and run it. Two kinds of token:

  MNF1. (founding token, printed by meshnode genesis --expect N): this node is one of the
        mesh's founding nodes; it gossips until the N founding nodes have met, and only then
        starts its bus with routes to all of them.
  MNJ1. (join token, made by meshnode token create): the mesh has formed; this node enrols
        through the mesh's vault, which hands it the mesh's credentials sealed to this
        node's own key, then starts its bus with routes to the current members.

With --leaf (and a join token) the node is a site of the mesh, not a server: it links to the
mesh's servers over a leafnode connection it opens itself (so it works from behind NAT), runs
its own JetStream, stores its modules' events while its link is down, and admits the mesh's
registered modules from its copy of the registry. The mesh's servers need leaf-addr set;
the site's modules connect on loopback (docs/scale.md, Sites).

Later restarts are meshnode run. With --no-run, join writes the data dir (the node's keys,
the mesh's foundation or enrolment, and meshnode.yaml with the addresses given) and exits 0
without starting the node: the service (meshnode run, the systemd unit) starts it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token, err := joinToken(cmd, token, tokenFile)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(cmd, config.Run())
			if err != nil {
				return err
			}
			keep := func() error {
				kept, err := keepAddresses(cmd, cfg)
				if kept != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "its addresses are kept in %s: `meshnode run --data-dir %s` and the service start it with them\n", kept, cfg.DataDir)
				}
				return err
			}
			if leaf {
				return joinSite(cmd, cfg, token, noRun)
			}
			if strings.HasPrefix(strings.TrimSpace(token), vault.TokenPrefix) {
				ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
				f, err := node.Join(ctx, cfg, token)
				cancel()
				if err != nil && cmd.Context().Err() != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "meshnode: stopped by a signal before enrolling:", err)
					return nil // a requested stop
				}
				if err != nil {
					return err
				}
				if noRun {
					fmt.Fprintf(cmd.OutOrStdout(), "node %s enrolled in mesh %s\n", cfg.Name, f.MeshID)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "node %s enrolled in mesh %s; joining its members\n", cfg.Name, f.MeshID)
				}
				if err := keep(); err != nil {
					return err
				}
				return runOrHandOff(cmd, cfg, noRun)
			}
			f, err := node.Found(cfg, token)
			if err != nil {
				return err
			}
			if noRun {
				fmt.Fprintf(cmd.OutOrStdout(), "node %s is a founding node of mesh %s (%d servers); it forms the mesh with the others once started\n", cfg.Name, f.MeshID, f.Expect)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "node %s founds mesh %s (%d servers); waiting for the others\n", cfg.Name, f.MeshID, f.Expect)
			}
			if err := keep(); err != nil {
				return err
			}
			return runOrHandOff(cmd, cfg, noRun)
		},
	}
	addNodeFlags(cmd, config.Run())
	cmd.Flags().StringVar(&token, "token", "", "a join token (MNJ1.) or the founding token (MNF1.) genesis printed (visible in ps: prefer --token-file or "+config.TokenEnv+")")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "a file holding the token (the file is read, not kept)")
	cmd.Flags().BoolVar(&leaf, "leaf", false, "join as a site of the mesh, linked to its servers as a leafnode (a join token; the servers need leaf-addr)")
	cmd.Flags().BoolVar(&noRun, "no-run", false, "write the data dir and its config, then exit instead of running the node (for systemd to start meshnode run)")
	return cmd
}

// runOrHandOff runs the node join prepared, or with noRun says how to start it and returns:
// a machine joined by its provisioning (cloud-init, Ansible) hands the node to systemd,
// which must be the only one running it.
func runOrHandOff(cmd *cobra.Command, cfg config.Config, noRun bool) error {
	if !noRun {
		return runNode(cmd, config.Run(), false)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "data dir %s is ready; start the node with `systemctl enable --now meshnode` or `meshnode run --data-dir %s`\n", cfg.DataDir, cfg.DataDir)
	return nil
}

// joinToken is the token join uses: from --token-file, MESHNODE_TOKEN or --token — exactly
// one. A token carries the mesh's gossip key and route credential, and a command line is
// visible to every user of the machine (ps), so --token is accepted with a warning.
func joinToken(cmd *cobra.Command, flag, file string) (string, error) {
	env, fromEnv := os.LookupEnv(config.TokenEnv)
	var sources []string
	for _, s := range []struct {
		name string
		set  bool
	}{{"--token", flag != ""}, {"--token-file", file != ""}, {config.TokenEnv, fromEnv && env != ""}} {
		if s.set {
			sources = append(sources, s.name)
		}
	}
	switch len(sources) {
	case 0:
		return "", usagef("a token is required: --token-file FILE or %s (a join token from `meshnode token create` on a node of the mesh, or the founding token genesis --expect N printed)", config.TokenEnv)
	case 1:
	default:
		return "", usagef("the token comes from one of --token, --token-file and %s, and %s are given", config.TokenEnv, strings.Join(sources, " and "))
	}
	switch {
	case file != "":
		b, err := readBounded(file, "token file", maxTokenBytes)
		if err != nil {
			return "", fmt.Errorf("read the token: %w", err)
		}
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
		return "", fmt.Errorf("%s is empty: write the token genesis or `meshnode token create` printed into it", file)
	case env != "":
		return strings.TrimSpace(env), nil
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "meshnode: warning: a token on the command line is visible to every user of this machine (ps); use --token-file FILE or %s\n", config.TokenEnv)
	return flag, nil
}

// startExtension is how much longer systemd waits for READY at each change of the start's
// phase (formation progress included): a founding node may wait long for its peers.
const startExtension = 5 * time.Minute

// runNode opens a node, announces it, and runs it until a signal.
func runNode(cmd *cobra.Command, defaults config.Config, create bool) error {
	cfg, err := loadConfig(cmd, defaults)
	if err != nil {
		return err
	}
	// SIGINT and SIGTERM end ctx, caught since the command started (commandContext).
	ctx := cmd.Context()
	log := newLogger(cfg, os.Stderr)
	if held, err := site.Load(cfg.DataDir); err == nil {
		return runSite(cmd, cfg, held, log)
	} else if !errors.Is(err, site.ErrNotSite) {
		return err
	}
	// A requested stop ends within shutdown-timeout whatever the node is doing (opening, a
	// release nobody answers once the peers are gone): what is left is cut short, which the
	// store survives (it survives kill -9).
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-finished:
			return
		case <-ctx.Done():
		}
		select {
		case <-finished:
		case <-time.After(time.Duration(cfg.ShutdownTimeout)):
			log.Warn("stopping took longer than shutdown-timeout; exiting without waiting for the rest", "shutdown_timeout", time.Duration(cfg.ShutdownTimeout))
			os.Exit(exitOK)
		}
	}()
	defer startTrimming(ctx)()  // an idle node hands back the memory it freed
	defer heapfloor.Keep(ctx)() // and a busy one with a small heap collects less often
	for {
		err := runOnce(ctx, cmd, cfg, log, create)
		if errors.Is(err, node.ErrRestart) {
			// Growing into a mesh: the node opens again on its data dir, and migrates.
			log.Info("restarting to go on growing into a mesh")
			continue
		}
		sdNotify("STOPPING=1")
		return err
	}
}

// runOnce opens the node on cfg, prints the ready line and runs it until ctx ends or it
// stops; node.ErrRestart asks for another run.
func runOnce(ctx context.Context, cmd *cobra.Command, cfg config.Config, log *slog.Logger, create bool) error {
	n := node.New(cfg, log)
	n.CreateIdentity = create
	n.OnPhase = func(phase string) {
		if phase != "" {
			// While it forms or waits for its peers, systemd hears why, and that the start
			// takes longer than TimeoutStartSec: each change extends it.
			sdNotify(fmt.Sprintf("STATUS=%s\nEXTEND_TIMEOUT_USEC=%d", phase, startExtension.Microseconds()))
		}
	}
	n.OnStartMemory = func(err error) {
		// nats-server's restore cannot be interrupted; the process ends with the reason.
		fmt.Fprintln(os.Stderr, "meshnode:", err)
		os.Exit(1)
	}
	if err := n.OpenContext(ctx); err != nil {
		if ctx.Err() != nil {
			log.Info("stopped before the node was ready", "reason", "signal", "err", err)
			return nil // a requested stop, while the node waited for its mesh to form
		}
		if errors.Is(err, datadir.ErrNoIdentity) {
			return fmt.Errorf("%w; `meshnode run` starts an existing node: create a mesh with `meshnode genesis --data-dir %s --name %s` (or try one with `meshnode up`)", err, cfg.DataDir, cfg.Name)
		}
		return err
	}
	defer n.Close()

	id := n.Identity()
	fmt.Fprintf(cmd.OutOrStdout(), "meshnode ready: node %s, mesh %s, client %s, http %s\n",
		id.Name, id.MeshID, n.ClientURL(), n.HTTPURL())
	fmt.Fprintf(cmd.OutOrStdout(), "  try: meshnode status --data-dir %s\n", cfg.DataDir)
	sdNotify("READY=1\nSTATUS=ready: node " + id.Name + ", mesh " + id.MeshID)
	err := n.Run(ctx)
	if ctx.Err() != nil {
		log.Info("stopping", "reason", "signal")
	}
	return err
}
