package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/formats"
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
FILE.tmp and a rename). No seed and no key is written in plaintext: the file carries the mesh's foundation
(route credential, gossip key, vault identity) sealed under the barrier key, which only the
recovery key opens (meshnode vault recovery-key). Keep that key and operator.nk apart from
the snapshot files. Restore with meshnode genesis --from-snapshot FILE --recovery-key-file F.`,
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
	opts := snapshot.Options{MeshID: status.MeshID, Operator: publicKeyOf(creds), Version: formats.MeshnodeVersion()}
	// The vault seals the mesh's foundation under the barrier key: the file carries it, and
	// only the operator's recovery key opens it (genesis --from-snapshot).
	var sealed api.SealedFoundation
	if _, err := vaultCall(cmd, api.VaultVerbFoundation, api.VaultRequest{}, &sealed); err != nil {
		return fmt.Errorf("snapshot save: the vault did not seal the mesh's foundation for the file: %w; a snapshot without it cannot be restored whole, so none was written", err)
	}
	opts.Foundation = &sealed
	if opts.AuditHeads, err = auditHeads(cmd); err != nil {
		return fmt.Errorf("snapshot save: %w", err)
	}
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

// auditHeads asks each member of the mesh for its audit log's last record: a node restored
// from the file names them in the record its log begins with. A member that does not answer
// (down, or not serving yet) is left out: the save goes on without its head.
func auditHeads(cmd *cobra.Command) (map[string]api.AuditHead, error) {
	var members api.NodeMembersReply
	if err := askNode(cmd, api.NodeToolMembers, &members); err != nil {
		return nil, err
	}
	heads := map[string]api.AuditHead{}
	err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
		for _, m := range members.Members {
			reply, err := audit.Call(ctx, nc, m.Name, api.AuditRequest{Op: "query", Filter: api.AuditFilter{Last: 1}})
			if err != nil || reply.Error != "" {
				continue
			}
			h := api.AuditHead{}
			if len(reply.Records) > 0 {
				h = api.AuditHead{N: reply.Records[0].N, Hash: reply.Records[0].Hash}
			}
			heads[m.Name] = h
		}
		return nil
	})
	return heads, err
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
	"kind, format_version, meshnode_version, created, mesh_id, operator?, server, foundation?, audit_heads?, streams"

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
	foundation := "none: a restore from it is refused (save again with this meshnode)"
	if man.Foundation != nil {
		foundation = "sealed under the barrier key: genesis --from-snapshot opens it with the recovery key"
	}
	fmt.Fprintf(w, "mesh        %s\ncreated     %s\nwritten     by meshnode %s, format %d, through node %s\noperator    %s\nfoundation  %s\n",
		man.MeshID, man.Created.UTC().Format(time.RFC3339), man.MeshnodeVersion, man.FormatVersion, man.Server, operator, foundation)
	for _, name := range slices.Sorted(maps.Keys(man.AuditHeads)) {
		h := man.AuditHeads[name]
		fmt.Fprintf(w, "audit head  %s: record %d, hash %s\n", name, h.N, h.Hash)
	}
	fmt.Fprintln(w)
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
