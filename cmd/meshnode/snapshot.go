package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/snapshot"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"
)

func newSnapshotCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Save the mesh's state to a backup file, and inspect one"}
	cmd.AddCommand(newSnapshotSaveCmd(), newSnapshotInspectCmd())
	return cmd
}

func newSnapshotSaveCmd() *cobra.Command {
	var force, asJSON bool
	cmd := &cobra.Command{
		Use:   "save FILE [--force] [--json]",
		Short: "Save every stream of the mesh (registry, vault's sealed records, seats, events, artifacts, ...) to FILE, online",
		Long: `Save every stream of the mesh — the registry, the vault's records (sealed under the
barrier key, which the file does not hold), provisions, STATE, the seats' leases and queued
jobs, the modules' KV buckets, DEAD, EVENTS and the artifacts — to FILE, through any node, as
the operator. The mesh keeps serving meanwhile. FILE is written whole or not at all (through
FILE.tmp and a rename). No seed is written: keep the data dirs' operator.nk and the
barrier key apart. Restoring a file is not built yet (meshnode genesis --from-snapshot).`,
		Example: `  meshnode snapshot save /backups/mesh-$(date +%F).snap
  meshnode snapshot save mesh.snap --force --context prod`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return saveSnapshot(cmd, args[0], force, asJSON)
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "replace FILE when it exists")
	cmd.Flags().BoolVar(&asJSON, "json", false, manifestKeys)
	return cmd
}

// saveSnapshot saves the mesh the verb connects to into path.
func saveSnapshot(cmd *cobra.Command, path string, force, asJSON bool) error {
	if _, err := os.Lstat(path); err == nil && !force {
		return fmt.Errorf("%s exists: name another file, or pass --force to replace it", path)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot save: %w", err)
	}
	var status api.NodeStatus
	if err := askNode(cmd, api.NodeToolStatus, &status); err != nil {
		return err
	}
	_, creds, err := clientTarget(cmd)
	if err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	opts := snapshot.Options{MeshID: status.MeshID, Operator: publicKeyOf(creds), Version: node.Version()}
	if isTerminal(stderr) {
		opts.Progress = func(s snapshot.Stream) {
			fmt.Fprintf(stderr, "snapshot %s: %d messages, %s\n", s.Name(), s.State.Msgs, sizeText(s.Size))
		}
	}
	var man snapshot.Manifest
	err = withBusFor(cmd, 0, func(ctx context.Context, nc *nats.Conn) error {
		// Interrupted, the save removes FILE.tmp and its spool before it returns.
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		man, err = snapshot.Save(ctx, nc, path, opts)
		return err
	})
	if err != nil {
		return fmt.Errorf("snapshot save: %w", err)
	}
	if asJSON {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(man)
	}
	var msgs uint64
	var size int64
	for _, s := range man.Streams {
		msgs += s.State.Msgs
		size += s.Size
	}
	fmt.Fprintf(cmd.OutOrStdout(), "saved mesh %s to %s: %d streams, %d messages, %s, through node %s\n",
		man.MeshID, path, len(man.Streams), msgs, sizeText(size), man.Server)
	return nil
}

// publicKeyOf is the public key of the seed in file, "" when it does not read as one.
func publicKeyOf(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return ""
	}
	defer kp.Wipe()
	pub, _ := kp.PublicKey()
	return pub
}

// manifestKeys is the help of --json, which prints a snapshot's manifest.
const manifestKeys = "print the snapshot's manifest as one JSON object (each of its streams has config, state, consumers?, entry, size, sha256): " +
	"kind, format_version, meshnode_version, created, mesh_id, operator?, server, streams"

func newSnapshotInspectCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect FILE [--json]",
		Short: "Check a snapshot file whole and print what it holds; exit 1 with the reason when it is bad",
		Example: `  meshnode snapshot inspect mesh.snap
  meshnode snapshot inspect mesh.snap --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := snapshot.Open(args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(r.Manifest())
			}
			return printSnapshot(cmd.OutOrStdout(), args[0], r.Manifest())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, manifestKeys)
	return cmd
}

// printSnapshot prints a snapshot's manifest for a person.
func printSnapshot(w io.Writer, path string, man snapshot.Manifest) error {
	operator := man.Operator
	if operator == "" {
		operator = "-"
	}
	fmt.Fprintf(w, "snapshot %s: whole, every checksum matches\n", path)
	fmt.Fprintf(w, "mesh      %s\ncreated   %s\nwritten   by meshnode %s, format %d, through node %s\noperator  %s\n\n",
		man.MeshID, man.Created.UTC().Format(time.RFC3339), man.MeshnodeVersion, man.FormatVersion, man.Server, operator)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tMESSAGES\tSEQUENCES\tBYTES\tCONSUMERS")
	for _, s := range man.Streams {
		seqs := "-"
		if s.State.Msgs > 0 {
			seqs = fmt.Sprintf("%d–%d", s.State.FirstSeq, s.State.LastSeq)
		}
		consumers := "-"
		if len(s.Consumers) > 0 {
			consumers = strings.Join(s.Consumers, ",")
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", s.Name(), s.State.Msgs, seqs, sizeText(s.Size), consumers)
	}
	return tw.Flush()
}

// sizeText is n bytes for a person: "987 B", "6.5 KiB", "1.2 GiB".
func sizeText(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n)/1024, 0
	for ; f >= 1024 && i < len(units)-1; i++ {
		f /= 1024
	}
	return fmt.Sprintf("%.1f %ciB", f, units[i])
}
