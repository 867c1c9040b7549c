package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/meshca"
	"github.com/spf13/cobra"
)

func newStatusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the running node's state",
		Long: `Show the state of a node: the one running on --data-dir (asked over its HTTP API), or the
one whose client port --server, MESHNODE_SERVER or a context names (asked over its bus, as
the operator: --creds; no data dir needed on this machine).

In a mesh, the versions row (JSON: members, each server's name, state and version) shows the
meshnode version each server runs as the gossip tells it: a mesh in a rolling upgrade shows
two, and a server older than version reporting shows none. The formats row (JSON: formats,
formats_error) is the version of each format the servers write and read of one another
that they agree on: the older one until every server runs the newer binary.`,
		Example: `  meshnode status
  meshnode status --json --data-dir /var/lib/meshnode
  meshnode status --server tls://10.0.0.2:4222 --creds operator.nk --ca ca.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := askStatus(cmd)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			printStatus(cmd.OutOrStdout(), st)
			if !st.Ready {
				return fmt.Errorf("node %s is not ready: %s", st.Name, st.Reason)
			}
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: name, mesh_id, version, client_url, http_url, cluster_addr, gossip_addr, ready, started, uptime_seconds, connections, jetstream, audit, reason?, growing?, applied_revision?, replication?, members?")
	return cmd
}

// askStatus asks the node the verb names for its status: over the bus when it is named by
// server, else over the HTTP API of the node running on the data dir.
func askStatus(cmd *cobra.Command) (api.NodeStatus, error) {
	var st api.NodeStatus
	remote, err := byServer(cmd)
	if err != nil {
		return st, err
	}
	if remote {
		return st, askNode(cmd, api.NodeToolStatus, &st)
	}
	dataDir, err := clientDataDir(cmd)
	if err != nil {
		return st, err
	}
	return fetchStatus(cmd.Context(), dataDir)
}

// clientDataDir finds the data dir of the node a client verb talks to: --data-dir, the
// configuration, else the `up` default if a node runs there, else the `run` default.
func clientDataDir(cmd *cobra.Command) (string, error) {
	if explicitDataDir(cmd) {
		cfg, err := loadConfig(cmd, config.Up())
		return cfg.DataDir, err
	}
	c, err := contextOf(cmd)
	if err != nil {
		return "", err
	}
	if c != nil {
		if c.DataDir == "" {
			// Never the local default instead: the name and seed there are another node's.
			return "", fmt.Errorf("context %s names a server, and meshnode %s reads a node's data dir: pass --data-dir, or use a context made with --data-dir",
				c.Name, strings.TrimPrefix(cmd.CommandPath(), "meshnode "))
		}
		return c.DataDir, nil
	}
	for _, dir := range []string{config.DefaultUpDataDir, config.DefaultRunDataDir} {
		if _, err := os.Stat(filepath.Join(dir, datadir.InfoFile)); err == nil {
			return dir, nil
		}
	}
	return config.DefaultUpDataDir, nil
}

// explicitDataDir reports whether the data dir is given (flag, configuration or
// environment): then no saved context applies.
func explicitDataDir(cmd *cobra.Command) bool {
	return cmd.Flags().Changed("data-dir") || cmd.Flags().Changed("config") ||
		os.Getenv(config.EnvName("data-dir")) != "" || os.Getenv(config.EnvPrefix+"CONFIG") != ""
}

// nodeHTTP is the HTTP client of the node running on dataDir: it trusts the mesh's CA as the
// data dir keeps it, which a node serving HTTP beyond loopback serves HTTPS with.
func nodeHTTP(dataDir string) *http.Client {
	pool, err := meshca.RootCAs(filepath.Join(dataDir, meshca.CAFile))
	if err != nil {
		return meshca.HTTPClient(nil) // no CA yet: a node on loopback, or one still starting
	}
	return meshca.HTTPClient(pool)
}

// fetchStatus asks the node running on dataDir for its status over its HTTP API.
func fetchStatus(ctx context.Context, dataDir string) (api.NodeStatus, error) {
	info, err := datadir.ReadInfo(dataDir)
	if err != nil {
		return api.NodeStatus{}, err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if info.Forming != "" {
		if !processAlive(info.PID) {
			return api.NodeStatus{}, fmt.Errorf("%w with data dir %s: its %s names process %d, which has exited while %s",
				datadir.ErrNotRunning, dataDir, datadir.InfoFile, info.PID, info.Forming)
		}
		return api.NodeStatus{Name: info.Name, MeshID: info.MeshID, Version: info.Version, ClusterAddr: info.ClusterAddr,
			GossipAddr: info.GossipAddr, Started: info.Started, UptimeSeconds: time.Since(info.Started).Seconds(),
			Reason: "forming the mesh: " + info.Forming}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, info.HTTPURL+"/v1/status", nil)
	resp, err := nodeHTTP(dataDir).Do(req)
	if err != nil {
		if !processAlive(info.PID) {
			return api.NodeStatus{}, fmt.Errorf("%w with data dir %s: its %s names process %d, which has exited; start it with `meshnode up --data-dir %s` (or `meshnode run`)",
				datadir.ErrNotRunning, dataDir, datadir.InfoFile, info.PID, dataDir)
		}
		return api.NodeStatus{}, fmt.Errorf("node %s (pid %d) does not answer on %s: %v", info.Name, info.PID, info.HTTPURL, err)
	}
	defer resp.Body.Close()
	const maxStatusBytes = 16 << 20 // a status is kilobytes; a node's of 10,000 modules, a few MiB
	var st api.NodeStatus
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxStatusBytes+1))
	if len(body) > maxStatusBytes {
		return api.NodeStatus{}, fmt.Errorf("node %s answered %s with more than %d bytes, not a status: is %s the node's HTTP address?", info.Name, resp.Status, maxStatusBytes, info.HTTPURL)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return api.NodeStatus{}, fmt.Errorf("node %s answered %s with %q, not a status", info.Name, resp.Status, body)
	}
	return st, nil
}

func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	return p.Signal(syscall.Signal(0)) == nil
}

func printStatus(w io.Writer, st api.NodeStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	ready := "yes"
	if !st.Ready {
		ready = "no: " + st.Reason
	}
	rows := [][2]string{
		{"node", st.Name},
		{"mesh", st.MeshID},
		{"version", st.Version},
		{"ready", ready},
		{"uptime", (time.Duration(st.UptimeSeconds) * time.Second).String()},
		{"client", st.ClientURL},
		{"http", st.HTTPURL},
		{"cluster", st.ClusterAddr},
		{"gossip", st.GossipAddr},
		{"connections", fmt.Sprint(st.Connections)},
		{"jetstream", fmt.Sprintf("%s, %d streams, %d consumers, %d messages, %d bytes",
			st.JetStream.Mode, st.JetStream.Streams, st.JetStream.Consumers, st.JetStream.Messages, st.JetStream.Bytes)},
		{"audit", auditLine(st.Audit)},
	}
	if st.Growing != "" {
		rows = append(rows, [2]string{"growing", st.Growing})
	}
	if r := st.Replication; r != nil {
		rows = append(rows, [2]string{"replication", replicationLine(r)})
	}
	if len(st.Members) > 0 {
		rows = append(rows, [2]string{"versions", versionsLine(st.Members)})
	}
	if len(st.Formats) > 0 || st.FormatsError != "" {
		rows = append(rows, [2]string{"formats", formatsLine(st.Formats, st.FormatsError)})
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	tw.Flush()
	if r := st.Replication; r != nil && len(r.Streams) > 0 {
		printStreams(w, r)
	}
}

// unknownVersion stands for the version of a member that does not tell it.
const unknownVersion = "unknown (a meshnode older than version reporting)"

// versionsLine is the status's versions row: the one version every server runs, or each
// version with the servers on it, so a mesh in a rolling upgrade shows which are done.
func versionsLine(ms []api.MemberVersion) string {
	on := map[string][]string{}
	for _, m := range ms {
		name := m.Name
		if m.State != "alive" {
			name += " (" + m.State + ")"
		}
		v := cmp.Or(m.Version, unknownVersion)
		on[v] = append(on[v], name)
	}
	if len(on) == 1 {
		for v := range on {
			return fmt.Sprintf("every server (%d) runs %s", len(ms), v)
		}
	}
	var parts []string
	for _, v := range slices.Sorted(maps.Keys(on)) {
		parts = append(parts, v+" on "+strings.Join(on[v], ", "))
	}
	return "mixed (finish the upgrade one server at a time): " + strings.Join(parts, "; ")
}

// formatsLine is the status's formats row: the version of each format the servers write and
// read of one another that they agree on — during an upgrade the older one, until every
// server runs the newer binary — or why they cannot agree.
func formatsLine(agreed map[string]int, failed string) string {
	if failed != "" {
		return failed
	}
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(agreed)) {
		parts = append(parts, fmt.Sprintf("%s %d", name, agreed[name]))
	}
	return strings.Join(parts, ", ") + " (written by every server, read by every one)"
}

// replicationLine is the status's replication row: the servers, the copies kept, and how
// many streams have a quorum.
func replicationLine(r *api.NodeReplication) string {
	line := fmt.Sprintf("%d servers: %d copies of each stream, any %d may be down", r.Servers, r.Target, r.Tolerates)
	if r.Error != "" {
		return line + "; " + r.Error
	}
	quorum := 0
	for _, s := range r.Streams {
		if s.Quorum {
			quorum++
		}
	}
	line += fmt.Sprintf("; %d streams, %d with quorum", len(r.Streams), quorum)
	if quorum < len(r.Streams) {
		line += " (a stream without quorum refuses writes until a majority of its copies are up)"
	}
	return line
}

// shownStreams is how many streams status lists before it lists only those that need a look.
const shownStreams = 20

// printStreams lists each stream's replication: all of them on a small mesh, else those
// without quorum, with copies behind or another number of copies than the target.
func printStreams(w io.Writer, r *api.NodeReplication) {
	show := r.Streams
	if len(show) > shownStreams {
		show = nil
		for _, s := range r.Streams {
			if !s.Quorum || len(s.Behind) > 0 || s.Replicas != r.Target {
				show = append(show, s)
			}
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tREPLICAS\tCURRENT\tLEADER\tQUORUM")
	for _, s := range show {
		quorum := "yes"
		if !s.Quorum {
			quorum = "no: " + s.Why
		}
		replicas := fmt.Sprint(s.Replicas)
		if s.Replicas == 0 {
			replicas = "?"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", s.Name, replicas, s.Current, cmp.Or(s.Leader, "-"), quorum)
	}
	tw.Flush()
	if rest := len(r.Streams) - len(show); rest > 0 {
		fmt.Fprintf(w, "and %d more streams at %d copies, all current (--json lists every stream)\n", rest, r.Target)
	}
}

// auditLine is the status's audit row: records and lag, and the gaps if there are any.
func auditLine(a api.NodeAuditStatus) string {
	line := fmt.Sprintf("%d records, lag %d", a.Records, a.Lag)
	if a.Missed > 0 {
		line += fmt.Sprintf(", %d events missed (they left EVENTS before the log read them: see the node's log)", a.Missed)
	}
	return line
}
