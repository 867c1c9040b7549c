package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

// The deploy path's verbs (DESIGN §12): artifacts, deployments, and what runs where.

func newArtifactCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "artifact", Short: "Store the executables hosts run: put, ls, rm"}
	cmd.AddCommand(newArtifactPutCmd(), newArtifactLsCmd(), newArtifactRmCmd())
	return cmd
}

// withArtifacts runs f with the mesh's artifact store, on the operator's connection.
func withArtifacts(cmd *cobra.Command, f func(ctx context.Context, obs jetstream.ObjectStore) error) error {
	return withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		obs, err := artifact.Lookup(ctx, js)
		if err != nil {
			return err
		}
		return f(ctx, obs)
	})
}

func newArtifactPutCmd() *cobra.Command {
	var version string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "put MODULE FILE --version V",
		Short: "Store an executable (a static binary or a script) as a module's version",
		Long: `Store an executable as a module's version in the mesh's artifact store. Its SHA-256 digest is
its identity: hosts check it on every read and refuse anything else. A version is immutable: the
same file again changes nothing, another file under a stored version is refused.`,
		Example: `  meshnode artifact put shop ./shop --version 1.4.0
  meshnode deploy shop --version 1.4.0 --all`,
		Args: namedArgs(cobra.ExactArgs(2), argModule),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := artifact.CheckVersion(version); err != nil {
				return usagef("--version: %v", err)
			}
			if st, err := os.Stat(args[1]); err != nil || !st.Mode().IsRegular() {
				return usagef("%s is not a file", args[1])
			} else if st.Mode().Perm()&0o111 == 0 {
				return usagef("%s is not executable: a host runs an artifact as is (chmod +x it)", args[1])
			}
			var info artifact.Info
			err := withArtifacts(cmd, func(ctx context.Context, obs jetstream.ObjectStore) (err error) {
				info, err = artifact.Put(ctx, obs, args[0], version, args[1])
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), []artifact.Info{info})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "stored %s %s (%d bytes, %s)\n", info.Module, info.Version, info.Size, info.Digest)
			return nil
		},
	}
	cmd.Flags().StringVar(&version, "version", "", "the version to store it as (required)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the stored artifact as one JSON object: module, version, digest, size, stored")
	addClientFlags(cmd)
	return cmd
}

func newArtifactLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [MODULE]",
		Short: "List the stored artifacts, newest first per module",
		Example: `  meshnode artifact ls
  meshnode artifact ls shop --json`,
		Args: namedArgs(cobra.MaximumNArgs(1), argModule),
		RunE: func(cmd *cobra.Command, args []string) error {
			module := ""
			if len(args) == 1 {
				module = args[0]
			}
			var infos []artifact.Info
			err := withArtifacts(cmd, func(ctx context.Context, obs jetstream.ObjectStore) (err error) {
				infos, err = artifact.List(ctx, obs, module)
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), infos)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "MODULE\tVERSION\tSIZE\tDIGEST\tSTORED")
			for _, a := range infos {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", a.Module, a.Version, a.Size, a.Digest, a.Stored.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per artifact: module, version, digest, size, stored")
	addClientFlags(cmd)
	return cmd
}

func newArtifactRmCmd() *cobra.Command {
	var version string
	cmd := &cobra.Command{
		Use:     "rm MODULE --version V",
		Short:   "Remove a stored artifact that no deployment names",
		Example: `  meshnode artifact rm shop --version 1.4.0`,
		Args:    namedArgs(cobra.ExactArgs(1), argModule),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := artifact.CheckVersion(version); err != nil {
				return usagef("--version: %v", err)
			}
			return withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
				mods, err := admin.List(ctx, nc)
				if err != nil {
					return err
				}
				for _, m := range mods {
					if m.Module == args[0] && m.Deployment != nil && m.Deployment.Version == version {
						return fmt.Errorf("%s %s is deployed; deploy another version or undeploy it first", args[0], version)
					}
				}
				js, err := jetstream.New(nc)
				if err != nil {
					return err
				}
				obs, err := artifact.Lookup(ctx, js)
				if err != nil {
					return err
				}
				if err := artifact.Remove(ctx, obs, args[0], version); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s %s\n", args[0], version)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&version, "version", "", "the version to remove (required)")
	addClientFlags(cmd)
	return cmd
}

func newDeployCmd() *cobra.Command {
	var d api.Deployment
	var nodes string
	var env []string
	var asJSON bool
	var wait config.Duration
	cmd := &cobra.Command{
		Use:   "deploy MODULE --version V (--nodes a,b | --all) [--instances N] [--env K=V]... [--wait D] [-- ARGS...]",
		Short: "Run a registered module's stored artifact on some nodes, or all",
		Long: `Run a registered module's stored artifact on some nodes, or on all. The controller composes each
affected node's whole declaration and publishes it as state; each node applies the newest one:
it fetches the artifact (digest checked), the module's credentials and the secrets its manifest
declares from the vault, and supervises the processes (MESH_URL, MESH_CREDS, MESH_NODE and
MESH_SECRETS in their environment). ` + "`meshnode ps`" + ` shows what runs where.

With --wait, deploy stays until every instance it declared runs (progress on a terminal), and
fails with its reason if one crash-loops, or cannot be prepared for 15 s (its node tries again
meanwhile: a stream electing a new leader is no failure).`,
		Example: `  meshnode deploy shop --version 1.4.0 --all
  meshnode deploy worker --version 2 --nodes alpha,beta --instances 2 --env LOG_LEVEL=debug -- --queue jobs
  meshnode deploy shop --version 1.4.1 --all --wait 2m`,
		Args: namedArgs(cobra.MinimumNArgs(1), argModule),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				if dash != 1 {
					return usagef("name one module before --")
				}
				d.Args = args[1:]
			} else if len(args) != 1 {
				return usagef("name one module; put the module's own arguments after --")
			}
			if nodes != "" {
				d.Nodes = strings.Split(nodes, ",")
			}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return usagef("--env %q: write NAME=value", kv)
				}
				if d.Env == nil {
					d.Env = map[string]string{}
				}
				d.Env[k] = v
			}
			if err := deploy.CheckDeployment(&d); err != nil {
				return usagef("%v", err)
			}
			var reply api.DeployReply
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				reply, err = admin.Deploy(ctx, nc, api.DeployRequest{Module: args[0], Deployment: d})
				return err
			})
			if err != nil {
				return err
			}
			if err := printDeployed(cmd.OutOrStdout(), "deployed", reply, asJSON); err != nil || wait <= 0 {
				return err
			}
			return awaitRunning(cmd, reply, time.Duration(wait), asJSON)
		},
	}
	cmd.Flags().StringVar(&d.Version, "version", "", "the artifact's version (required)")
	cmd.Flags().StringVar(&nodes, "nodes", "", "the nodes to run it on, comma-separated")
	cmd.Flags().BoolVar(&d.All, "all", false, "run it on every node of the mesh")
	cmd.Flags().IntVar(&d.Instances, "instances", 1, "processes per node")
	cmd.Flags().BoolVar(&d.Auto, "auto", false, "also deploy each new artifact the build cascade makes of it")
	cmd.Flags().StringArrayVar(&env, "env", nil, "NAME=value for its environment (repeatable; never a secret: the manifest's secrets: reach it as files)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the answer as one JSON object: module, deployment, declared")
	cmd.Flags().Var(&wait, "wait", "stay until every instance runs, at most this long (e.g. 2m)")
	addClientFlags(cmd)
	return cmd
}

// waitSteady is how long deploy --wait must see an instance's process running before it
// counts: longer than a crashing process runs before its first restart's back-off (1 s).
const waitSteady = 1500 * time.Millisecond

// failGrace is how long deploy --wait lets an instance stay failed (not prepared: its node
// tries again after a back-off of 1, 2, 4 s…) before it gives up on it. An artifact fetched
// while the mesh's streams elect new leaders (two servers just lost) fails once or twice
// and then succeeds: CI's fault beds gave up at the first failure, within 10 s of the loss.
const failGrace = 15 * time.Second

// failedSince is when each node/instance was first seen failed, since it was last seen
// otherwise.
type failedSince map[string]time.Time

// over records whether key is failed at now, and reports whether it has stayed so for
// failGrace.
func (f failedSince) over(key string, failed bool, now time.Time) bool {
	if !failed {
		delete(f, key)
		return false
	}
	since, ok := f[key]
	if !ok {
		f[key] = now
		return false
	}
	return now.Sub(since) >= failGrace
}

// awaitRunning asks ps until every instance reply declared runs at the declared revision,
// at most within: done with a line per node (with --json nothing more: exit 0 says it);
// an error, with its reason, at once for an instance that crash-loops, and for one that
// could not be prepared once it has stayed so for failGrace (its node tries again).
// Progress goes to a terminal only.
func awaitRunning(cmd *cobra.Command, reply api.DeployReply, within time.Duration, asJSON bool) error {
	want := map[string]uint64{} // node → the declaration's revision
	for _, d := range reply.Declared {
		// A node the deployment moved off is declared too (without the module): no instance
		// of it will run there, so there is nothing to wait for on it.
		if reply.Deployment != nil && !reply.Deployment.Targets(d.Node) {
			continue
		}
		if d.Error != "" {
			return fmt.Errorf("%s on %s is not declared yet (%s): --wait would wait for nothing there; meshnode ps shows it once the next change or controller start declares it", reply.Module, d.Node, d.Error)
		}
		want[d.Node] = d.Revision
	}
	if len(want) == 0 {
		return fmt.Errorf("%s is declared on no node: nothing to wait for", reply.Module)
	}
	instances := 1
	if reply.Deployment != nil && reply.Deployment.Instances > 0 {
		instances = reply.Deployment.Instances
	}
	total := instances * len(want)
	stderr := cmd.ErrOrStderr()
	shown := false
	defer func() {
		if shown {
			fmt.Fprint(stderr, "\r\033[K")
		}
	}()
	deadline := time.Now().Add(within)
	// One connection for the whole wait; a ps that fails (the controller moving, say) is
	// asked again until the deadline.
	// An instance counts as running once ps has shown the same process running for
	// waitSteady: one that dies at once (and is started again after a back-off) does not.
	type seen struct {
		pid, restarts int
		since         time.Time
	}
	steady := map[string]seen{} // node/instance → the process first seen running
	failing := failedSince{}
	return withBusFor(cmd, 0, func(ctx context.Context, nc *nats.Conn) error {
		var last error
		for {
			running := 0
			states := map[string][]string{} // node → "instance N: state (reason)", each of its instances
			pctx, cancel := context.WithTimeout(ctx, requestTimeout)
			ps, err := admin.Ps(pctx, nc)
			cancel()
			if err != nil {
				last = err
			}
			for _, p := range ps {
				rev, ok := want[p.Node]
				if p.Module != reply.Module || !ok || p.Revision < rev {
					continue
				}
				state := p.State
				if p.Reason != "" {
					state += " (" + p.Reason + ")"
				}
				key := fmt.Sprintf("%s/%d", p.Node, p.Instance)
				switch p.State {
				case host.StateRunning:
					if was, ok := steady[key]; !ok || was.pid != p.PID || was.restarts != p.Restarts {
						steady[key] = seen{p.PID, p.Restarts, time.Now()}
					}
					if time.Since(steady[key].since) >= waitSteady {
						running++
					} else {
						state = fmt.Sprintf("running for under %s (restarts %d)", waitSteady, p.Restarts)
					}
				case host.StateCrashLooping:
					return fmt.Errorf("%s on %s (instance %d) is %s: %s; meshnode logs %s shows its output", p.Module, p.Node, p.Instance, p.State, p.Reason, p.Module)
				}
				if failing.over(key, p.State == host.StateFailed, time.Now()) {
					return fmt.Errorf("%s on %s (instance %d) has been %s for %s: %s; meshnode logs %s shows its output", p.Module, p.Node, p.Instance, p.State, failGrace, p.Reason, p.Module)
				}
				states[p.Node] = append(states[p.Node], fmt.Sprintf("instance %d: %s", p.Instance, state))
			}
			if err == nil && running >= total {
				if asJSON {
					return nil // the deploy's answer was the one record; the exit status says the rest
				}
				for _, node := range slices.Sorted(maps.Keys(want)) {
					fmt.Fprintf(cmd.OutOrStdout(), "  %s: running (%d of %d)\n", node, instances, instances)
				}
				return nil
			}
			if time.Now().After(deadline) {
				if err != nil {
					return fmt.Errorf("after %s, ps does not answer: %w", within, last)
				}
				var where []string
				for _, node := range slices.Sorted(maps.Keys(want)) {
					state := strings.Join(states[node], ", ")
					if state == "" {
						state = "has not applied the declaration yet"
					}
					where = append(where, node+": "+state)
				}
				return fmt.Errorf("after %s, %d of %d instances of %s run (%s); meshnode ps shows where it stands", within, running, total, reply.Module, strings.Join(where, "; "))
			}
			if isTerminal(stderr) {
				fmt.Fprintf(stderr, "\rwaiting: %d of %d instances of %s running", running, total, reply.Module)
				shown = true
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(250 * time.Millisecond): // a poll of ps: nothing tells a change
			}
		}
	})
}

func newUndeployCmd() *cobra.Command {
	var nodes string
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "undeploy MODULE [--nodes a,b]",
		Short:   "Stop a module on some nodes, or everywhere; its credentials leave those nodes",
		Example: "  meshnode undeploy shop\n  meshnode undeploy shop --nodes gamma",
		Args:    namedArgs(cobra.ExactArgs(1), argModule),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := api.UndeployRequest{Module: args[0]}
			if nodes != "" {
				req.Nodes = strings.Split(nodes, ",")
			}
			var reply api.DeployReply
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				reply, err = admin.Undeploy(ctx, nc, req)
				return err
			})
			if err != nil {
				return err
			}
			return printDeployed(cmd.OutOrStdout(), "undeployed", reply, asJSON)
		},
	}
	cmd.Flags().StringVar(&nodes, "nodes", "", "stop it only on these nodes, comma-separated")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the answer as one JSON object: module, declared")
	addClientFlags(cmd)
	return cmd
}

func printDeployed(w io.Writer, verb string, r api.DeployReply, asJSON bool) error {
	if asJSON {
		return writeJSONLines(w, []api.DeployReply{r})
	}
	fmt.Fprintf(w, "%s %s\n", verb, r.Module)
	for _, d := range r.Declared {
		switch {
		case d.Error != "":
			fmt.Fprintf(w, "  %s: not declared yet (%s); the next change or controller start declares it\n", d.Node, d.Error)
		case d.Changed:
			fmt.Fprintf(w, "  %s: declaration revision %d\n", d.Node, d.Revision)
		default:
			fmt.Fprintf(w, "  %s: unchanged (revision %d)\n", d.Node, d.Revision)
		}
	}
	return nil
}

func newPsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "What runs where: each deployed module's processes, per node, and which nodes are behind",
		Example: `  meshnode ps
  meshnode ps --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ps []api.Process
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				ps, err = admin.Ps(ctx, nc)
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), ps)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "MODULE\tNODE\tVERSION\tREVISION\tSTATE\tPID\tRESTARTS\tISOLATION\tREASON")
			for _, p := range ps {
				rev := fmt.Sprint(p.Revision)
				if p.Revision < p.Declared {
					rev += fmt.Sprintf(" (behind %d)", p.Declared)
				}
				pid := "-"
				if p.PID > 0 {
					pid = fmt.Sprint(p.PID)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", p.Module, p.Node, p.Version, rev, p.State, pid, p.Restarts, isolationSummary(p.Isolation), p.Reason)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per process (isolation as docs/isolation.md says): module, node, version, instance, revision, declared, state, restarts, pid?, since?, reason?, reported?, isolation?")
	addClientFlags(cmd)
	return cmd
}

// isolationSummary is a running process's isolation in a few words: its user, its Landlock
// ABI, how its processes are contained, and a "reduced" mark when the machine gave less.
func isolationSummary(iso *api.Isolation) string {
	if iso == nil {
		return "-"
	}
	user := iso.User
	if strings.HasPrefix(user, "the node's") {
		user = "node's uid"
	}
	contained := "no containment"
	switch {
	case iso.Cgroup != "":
		contained = "cgroup"
	case iso.Subreaper:
		contained = "subreaper"
	}
	s := user + " · landlock " + strings.TrimPrefix(iso.Landlock, "abi ") + " · " + contained
	if len(iso.Reduced) > 0 {
		s += " (reduced)"
	}
	return s
}

func newLogsCmd() *cobra.Command {
	var nodeName string
	var follow bool
	var tail int64
	cmd := &cobra.Command{
		Use:     "logs MODULE [--node N] [-f]",
		Short:   "Print a deployed module's output (stdout and stderr) on a node",
		Example: "  meshnode logs shop\n  meshnode logs shop --node beta -f",
		Args:    namedArgs(cobra.ExactArgs(1), argModule),
		RunE: func(cmd *cobra.Command, args []string) error {
			// On withBus's connection a key the bus refuses (a module's seed) ends the verb at
			// once, named; on a plain one the request waited out its 30 s timeout.
			return withBusFor(cmd, 0, func(ctx context.Context, nc *nats.Conn) error {
				return printLogs(ctx, cmd, nc, args[0], nodeName, tail, follow)
			})
		},
	}
	cmd.Flags().StringVar(&nodeName, "node", "", "the node whose output to print (default: the first that runs it)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output")
	cmd.Flags().Int64Var(&tail, "tail", 64<<10, "start this many bytes before the end")
	addClientFlags(cmd)
	return cmd
}

// printLogs prints module's output on nodeName (the first that runs it when ""), the last
// tail bytes first, and with follow keeps printing until ctx ends or a signal.
func printLogs(ctx context.Context, cmd *cobra.Command, nc *nats.Conn, module, nodeName string, tail int64, follow bool) error {
	base, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if nodeName == "" {
		ctx, cancel := context.WithTimeout(base, requestTimeout)
		ps, err := admin.Ps(ctx, nc)
		cancel()
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.Module == module {
				nodeName = p.Node
				break
			}
		}
		if nodeName == "" {
			return fmt.Errorf("module %s runs nowhere (`meshnode ps`); name a node with --node", module)
		}
	}
	req := api.LogsRequest{Module: module, Offset: -tail}
	for {
		var reply api.LogsReply
		ctx, cancel := context.WithTimeout(base, requestTimeout)
		b, _ := json.Marshal(req)
		msg, err := nc.RequestWithContext(ctx, manifest.NodeToolSubject(nodeName, api.LogsTool), b)
		cancel()
		if err == nil {
			err = json.Unmarshal(msg.Data, &reply)
		}
		if err != nil {
			return fmt.Errorf("ask node %s for %s's output: %w", nodeName, module, err)
		}
		if reply.Error != "" {
			return fmt.Errorf("node %s: %s", nodeName, reply.Error)
		}
		cmd.OutOrStdout().Write(reply.Data)
		req.Offset = reply.Next
		if len(reply.Data) == host.MaxLogRead {
			continue
		}
		if !follow {
			return nil
		}
		select {
		case <-base.Done():
			return ctx.Err() // nil after a signal; the refusal when the bus refused the key
		case <-time.After(500 * time.Millisecond):
		}
	}
}
