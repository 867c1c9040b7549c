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
	f.String("http-addr", defaults.HTTPAddr, "host:port for /healthz, /readyz, /metrics and the status API (port 0: any free port)")
	f.String("log-level", defaults.LogLevel, "debug, info, warn or error")
	f.String("log-format", defaults.LogFormat, "text or json")
	f.String("shutdown-timeout", defaults.ShutdownTimeout.String(), "how long a graceful stop may take")
	f.String("events-max-age", defaults.EventsMaxAge.String(), "how long the EVENTS stream keeps an event (e.g. 7d)")
	f.String("audit-retention", "0s", "how long the audit log keeps a record (0s: keep everything)")
	f.String("store-max-bytes", "0", "the most JetStream stores on this node, e.g. 20GiB (0: 75% of the disk's free space)")
	f.String("events-max-bytes", "0", "the most the EVENTS stream keeps; past it emits are refused (0: half the store)")
	f.String("module-events-max-bytes", "0", "the most of EVENTS one module may hold; past it its emits are refused (0: a quarter of EVENTS)")
	f.String("client-tls", "auto", "when the client port is TLS: auto (when client-addr is not loopback) or always")
	f.String("dead-max-bytes", "0", "the most the DEAD stream keeps (0: a tenth of the store)")
	f.String("max-event-bytes", "0", "the largest event EVENTS accepts (0: the bus's maximum message size)")
	f.String("rate-limit", strconv.Itoa(defaults.RateLimit), "requests a second one module may make of whoami, the seat tool and the vault (0: no limit)")
	f.String("mesh-seats", strings.Join(defaults.MeshSeats, ","), "the mesh's own seats this node is a candidate for, comma-separated (\"\": none)")
	f.String("git-repos", "", "local bare git repositories this node serves to the build cascade, name=path, comma-separated (a candidate for mesh-git)")
	f.String("builder", "false", "run build jobs (a candidate for mesh-build-machine)")
	f.String("provision-interval", defaults.ProvisionInterval.String(), "how often the controller asks each provisioner what it holds")
}

// loadConfig builds the configuration: defaults < file < MESHNODE_* env < flags. Every
// problem is a usage error (exit 2) naming the key.
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
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := cfg.LoadFile(path, data); err != nil {
			return cfg, usageError{err: err}
		}
	case !explicit && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)):
		// No file beside the data dir: defaults, env and flags decide.
	case err != nil:
		return cfg, usagef("read configuration: %v", err)
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
