package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/meshnode/meshnode/config"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// addConfigFlags adds the flags every verb takes: --config and --data-dir.
func addConfigFlags(cmd *cobra.Command) {
	cmd.Flags().String("config", "", "configuration file (default: meshnode.yaml in the data dir, if present; env MESHNODE_CONFIG)")
	cmd.Flags().String("data-dir", "", "the node's data directory")
}

// addNodeFlags adds the flags of the verbs that run a node: one per configuration key, with
// the defaults shown in help.
func addNodeFlags(cmd *cobra.Command, defaults config.Config) {
	addConfigFlags(cmd)
	f := cmd.Flags()
	f.Lookup("data-dir").DefValue = defaults.DataDir
	f.Lookup("data-dir").Usage = "the node's data directory (store, keys, JetStream)"
	f.String("name", "", "node name, stable across restarts (default: the host name)")
	f.String("client-addr", defaults.ClientAddr, "host:port for NATS clients (port 0: any free port)")
	f.String("cluster-addr", defaults.ClusterAddr, "host:port for routes between nodes")
	f.String("gossip-addr", defaults.GossipAddr, "host:port for membership gossip")
	f.String("advertise", defaults.Advertise, "the address (IP or DNS name) the other servers reach this node at, when its addresses bind every interface")
	f.String("leaf-addr", defaults.LeafAddr, "host:port where this server accepts sites' leafnode links, for meshnode join --leaf (empty: none; TLS beyond loopback)")
	f.String("http-addr", defaults.HTTPAddr, "host:port for /healthz, /readyz, /metrics, the status API and the console (port 0: any free port; HTTPS beyond loopback)")
	f.String("log-level", defaults.LogLevel, "debug, info, warn or error")
	f.String("log-format", defaults.LogFormat, "text or json")
	f.String("shutdown-timeout", defaults.ShutdownTimeout.String(), "how long a graceful stop may take")
	f.String("events-max-age", defaults.EventsMaxAge.String(), "how long the EVENTS stream keeps an event (e.g. 7d)")
	f.String("audit-retention", "0s", "how long the audit log keeps a record (0s: keep everything)")
	f.String("sync", defaults.Sync, "when JetStream writes to the disk: always (before each ack; about 5× slower) or an interval of background flushes")
	f.String("store-max-bytes", "0", "the most JetStream stores on this node, e.g. 20GiB (0: 75% of the disk's free space)")
	f.String("events-max-bytes", "0", "the most the EVENTS stream keeps; past it emits are refused (0: half the store)")
	f.String("module-events-max-bytes", "0", "the most of EVENTS one module may hold; past it its emits are refused (0: a quarter of EVENTS)")
	f.String("seat-max-bytes", "0", "the most the work queue of a seat without backlog: keeps (0: a 1024th of the store's room for seat queues, 1MiB to 16MiB)")
	f.String("client-tls", "auto", "when the client port is TLS: auto (when client-addr is not loopback) or always")
	f.String("dead-max-bytes", "0", "the most the DEAD stream keeps (0: a tenth of the store)")
	f.String("dead-max-bytes-per-consumer", "0", "the most of DEAD one consumer's dead letters may hold; past it its own oldest go (0: a 16384th of DEAD, at least 64KiB)")
	f.String("max-event-bytes", "0", "the largest event EVENTS accepts (0: the bus's maximum message size)")
	f.String("rate-limit", strconv.Itoa(defaults.RateLimit), "requests a second one module may make of whoami, the seat tool and the vault (0: no limit)")
	f.String("emit-rate", strconv.Itoa(defaults.EmitRate), "events and seat jobs a second one module may send on this node; past it they are refused, retryably (0: no pace)")
	f.String("audit-max-lag", strconv.Itoa(defaults.AuditMaxLag), "events a live member's audit log may be behind before emits are refused, retryably (0: no back-pressure)")
	f.String("flood-rate", strconv.Itoa(defaults.FloodRate), "messages a second one module connection may send (bursts of a quarter second's worth) before the node disconnects and bars the module (0: not watched)")
	f.String("flood-bar", defaults.FloodBar.String(), "how long a module barred for flooding is refused first (doubling while it comes back flooding)")
	f.String("flood-bar-max", defaults.FloodBarMax.String(), "the longest bar of a module that keeps on flooding")
	f.String("mesh-seats", strings.Join(defaults.MeshSeats, ","), "the mesh's own seats this node is a candidate for, comma-separated (\"\": none)")
	f.String("git-repos", "", "local bare git repositories this node serves to the build cascade, name=path, comma-separated (a candidate for mesh-git)")
	f.String("builder", "false", "run build jobs (a candidate for mesh-build-machine)")
	f.String("provision-interval", defaults.ProvisionInterval.String(), "how often the controller asks each provisioner what it holds")
	f.String("drift-interval", defaults.DriftInterval.String(), "how often the node checks the mesh's streams, buckets and consumers and repairs what it may")
	f.String("snapshot-interval", "0s", "how often the holder of mesh-controller writes a snapshot of the mesh into snapshot-dir (0s: never; at least 1m)")
	f.String("snapshot-dir", "", "where scheduled snapshots are written (default: <data-dir>/snapshots)")
	f.String("snapshot-keep", strconv.Itoa(defaults.SnapshotKeep), "how many scheduled snapshots snapshot-dir keeps; the oldest beyond are deleted")
	f.String("isolation", defaults.Isolation, "full (modules and builds run only fully isolated) or reduced (with what the machine gives; says what is missing)")
	f.String("cgroup", "", "the cgroup v2 the node makes its modules' cgroups in (default: its own)")
	f.String("module-uids", "", "the uids, first-last, a node running as root gives its modules (default: 1,024 of its own, drawn by its data dir)")
	f.String("module-memory", "0", "the most memory one module instance may use, e.g. 512MiB (0: no limit)")
	f.String("module-processes", strconv.Itoa(defaults.ModuleProcesses), "the most processes one module instance may have (0: no limit)")
	f.String("module-disk", defaults.ModuleDisk.String(), "the most one module instance may keep in its work directory (0: no limit)")
	f.String("build-paths", "", "directories a build may read besides its tree and the system's runtime (toolchains outside /usr), comma-separated")
}

// loadConfig builds the configuration: defaults < file < MESHNODE_* env < flags. Every
// problem with what was written is a usage error (exit 2) naming the key; a file this user
// may not read is a failure (exit 1) saying whose it is to read.
func loadConfig(cmd *cobra.Command, defaults config.Config) (config.Config, error) {
	cfg := defaults
	f := cmd.Flags()

	// The data dir decides where meshnode.yaml is looked for, so find it first.
	dataDir := defaults.DataDir
	if v, ok := os.LookupEnv(config.EnvName("data-dir")); ok {
		dataDir = v
	}
	if f.Changed("data-dir") {
		dataDir, _ = f.GetString("data-dir")
	}
	path, _ := f.GetString("config")
	if path == "" {
		path = os.Getenv(config.EnvPrefix + "CONFIG")
	}
	explicit := path != ""
	if !explicit {
		path = filepath.Join(dataDir, config.FileName)
	}
	data, err := readBounded(path, "configuration", maxConfigBytes)
	switch {
	case err == nil:
		if err := cfg.LoadFile(path, data); err != nil {
			return cfg, usageError{err: err}
		}
	case !explicit && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)):
		// No file beside the data dir: defaults, env and flags decide.
	case errors.Is(err, fs.ErrPermission):
		// Not a mistake in the command: the file is there, this user may not read it.
		return cfg, fmt.Errorf("read configuration: %w; run meshnode as the user the node runs as (the data dir's owner), or let this user read %s", err, path)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.EISDIR), errors.Is(err, errTooLarge):
		return cfg, usagef("read configuration: %v; pass --config FILE (or %sCONFIG) naming a meshnode.yaml", err, config.EnvPrefix)
	case err != nil:
		return cfg, fmt.Errorf("read configuration: %w", err)
	}

	if err := cfg.LoadEnv(os.Environ()); err != nil {
		return cfg, usageError{err: err}
	}
	keys := config.Keys()
	slices.Sort(keys)
	for _, key := range keys {
		fl := f.Lookup(key)
		if fl == nil || !fl.Changed {
			continue
		}
		if err := cfg.Set(key, fl.Value.String()); err != nil {
			return cfg, usageError{err: fmt.Errorf("--%s: %w", key, err)}
		}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{err: err}
	}
	return cfg, nil
}

// newLogger builds the process's logger from the configuration.
func newLogger(cfg config.Config, w *os.File) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(cfg.LogLevel)) // validated already
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// addressKeys are the configuration keys that say where a node listens and how the others
// reach it: what a later `meshnode run --data-dir DIR` (the systemd unit's command) needs
// to start the same server.
var addressKeys = []string{"client-addr", "cluster-addr", "gossip-addr", "http-addr", "advertise", "client-tls", "leaf-addr"}

// keepAddresses writes the addresses given to genesis or join (by flag or environment) to
// meshnode.yaml in the data dir, so that the node's later starts — `meshnode run --data-dir`,
// the unit — listen and advertise as it was founded; otherwise a clustered node restarted
// without them binds 0.0.0.0 and refuses to advertise it. Nothing is written when a
// configuration file was given or the data dir has one already (the operator's own), or when
// no address was given. It returns the file written, if any.
func keepAddresses(cmd *cobra.Command, cfg config.Config) (string, error) {
	explicit, _ := cmd.Flags().GetString("config")
	if explicit != "" || os.Getenv(config.EnvPrefix+"CONFIG") != "" {
		return "", nil
	}
	values := map[string]string{}
	for _, key := range addressKeys {
		fl := cmd.Flags().Lookup(key)
		_, inEnv := os.LookupEnv(config.EnvName(key))
		if (fl == nil || !fl.Changed) && !inEnv {
			continue
		}
		v, err := cfg.Get(key)
		if err != nil {
			return "", err
		}
		values[key] = v
	}
	if len(values) == 0 {
		return "", nil
	}
	b, err := yaml.Marshal(values)
	if err != nil {
		return "", err
	}
	path := filepath.Join(cfg.DataDir, config.FileName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return "", nil // the operator's own file: theirs to keep
	}
	if err != nil {
		return "", fmt.Errorf("keep this node's addresses: %w", err)
	}
	b = append([]byte("# Written by meshnode genesis/join: the addresses this node was founded with, for\n# `meshnode run --data-dir` and the service. Edit them here; flags override them.\n"), b...)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return "", fmt.Errorf("keep this node's addresses: %w", err)
	}
	return path, f.Close()
}
