package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/streammove"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

// restoreDir is where, in the data dir, a restore unpacks each stream's snapshot before
// JetStream reads it; it is removed once the restore is done.
const restoreDir = "restore"

// Bus is what a restore needs of the node's bus: its own connection and JetStream, and the
// meta group's peers (embedbus.Bus is one).
type Bus interface {
	Conn() *nats.Conn
	JetStream() jetstream.JetStream
	Peers() map[string]bool
	MetaLeader() string
}

var _ Bus = (*embedbus.Bus)(nil)

// ManifestSum is the SHA-256 (hex) of the manifest's entry as the file holds it: what names
// a snapshot (SHA256SUMS covers every entry, and the manifest every stream's checksum).
func (r *Reader) ManifestSum() string { return r.manSum }

// Resume restores, at a node's start, the snapshot its foundation is Restoring from (genesis
// --from-snapshot): every stream of the file, into the mesh bus's server is part of, at
// replicas, before the node opens its controller, seats, vault, audit and deploy — then it
// clears the mark. The mesh's registry is restored last: the founding nodes wait for it
// (genesis.Founding.Restoring). Interrupted (kill -9), the next start goes on: a stream
// restored whole is kept, one cut short is restored again (streammove.Restore). The
// snapshot file is only read. phase reports the progress. On a foundation that is not
// restoring it does nothing.
func Resume(ctx context.Context, db *bolt.DB, dataDir string, f *genesis.Foundation, bus Bus, replicas int, phase func(string), log *slog.Logger) error {
	from := f.Restoring
	if from == nil {
		return nil
	}
	if from.File == "" {
		return awaitRestore(ctx, db, f, bus, replicas, phase, log)
	}
	r, err := Open(from.File)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("this node restores mesh %s from snapshot %s, which is gone: put the file back there and start again (the streams restored so far are kept)", f.MeshID, from.File)
	}
	if err != nil {
		return fmt.Errorf("this node restores mesh %s from a snapshot: %w", f.MeshID, err)
	}
	defer r.Close()
	if r.ManifestSum() != from.SHA256 {
		return fmt.Errorf("this node restores mesh %s from snapshot %s, but the file there is another snapshot now (manifest SHA-256 %s, genesis checked %s): put the file genesis read back and start again", f.MeshID, from.File, r.ManifestSum(), from.SHA256)
	}
	if err := awaitPeers(ctx, bus, f.Expect, phase); err != nil {
		return err
	}
	dir := filepath.Join(dataDir, restoreDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// The registry last, whatever the file's order: it is what the founding nodes wait for.
	streams := slices.Clone(r.Manifest().Streams)
	last := func(s Stream) int {
		if s.Name() == "KV_"+registry.Bucket {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(streams, func(a, b Stream) int { return last(a) - last(b) })
	for _, s := range streams {
		phase("restoring from a snapshot: " + s.Name())
		if err := r.Unpack(s.Name(), dir); err != nil {
			return err
		}
		if _, err := streammove.Restore(ctx, log, bus.Conn(), bus.JetStream(), dir, s.Stream, replicas); err != nil {
			return fmt.Errorf("restore stream %s from snapshot %s: %w; the next start goes on from there", s.Name(), from.File, err)
		}
		os.Remove(filepath.Join(dir, s.Name()+".snap"))
		log.Info("restored from the snapshot", "stream", s.Name(), "messages", s.State.Msgs, "last_seq", s.State.LastSeq, "replicas", replicas)
	}
	if err := restored(db, f, r.Manifest().AuditHeads); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		log.Warn("remove the restore's unpacked snapshots", "dir", dir, "err", err)
	}
	log.Info("restored the mesh from a snapshot", "mesh_id", f.MeshID, "snapshot", from.File, "created", from.Created, "streams", len(r.Manifest().Streams))
	return nil
}

// restored begins the node's audit log by naming the snapshot ("restored here", never a
// gap), then clears the foundation's mark.
func restored(db *bolt.DB, f *genesis.Foundation, heads map[string]api.AuditHead) error {
	key, err := f.NodeKey()
	if err != nil {
		return err
	}
	from := f.Restoring
	err = audit.BeginRestored(db, key, api.AuditRestored{Node: f.Node, MeshID: f.MeshID, Snapshot: from.SHA256, File: from.File, Created: from.Created, Heads: heads})
	if err != nil {
		return fmt.Errorf("begin the audit log with the restore: %w", err)
	}
	done := *f
	done.Restoring, done.AwaitGrowth = nil, false
	if err := genesis.New(db).Keep(&done); err != nil {
		return fmt.Errorf("record the restore done: %w", err)
	}
	*f = done
	return nil
}

// awaitRestore holds a founding node of a mesh being restored until the genesis node has
// restored the mesh's registry (restored last) at the mesh's replicas, and begins its audit
// log by naming the snapshot too.
func awaitRestore(ctx context.Context, db *bolt.DB, f *genesis.Foundation, bus Bus, replicas int, phase func(string), log *slog.Logger) error {
	phase("waiting for the genesis node to restore the mesh's streams from the snapshot")
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := bus.JetStream().Stream(rctx, "KV_"+registry.Bucket)
		cancel()
		if err == nil && st.CachedInfo().Config.Replicas >= replicas && st.CachedInfo().Config.Metadata[streammove.RestoringMeta] == "" {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the genesis node to restore the mesh from its snapshot: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	log.Info("the genesis node restored the mesh from a snapshot", "mesh_id", f.MeshID, "snapshot", f.Restoring.SHA256)
	return restored(db, f, nil)
}

// awaitPeers waits until expect servers are JetStream peers with a meta leader: a stream is
// placed at its replicas only on peers the meta group knows. A single node is its own.
func awaitPeers(ctx context.Context, bus Bus, expect int, phase func(string)) error {
	if expect < 3 {
		return nil
	}
	phase("restoring from a snapshot: waiting for every founding server to be a JetStream peer")
	for {
		current := 0
		for _, ok := range bus.Peers() {
			if ok {
				current++
			}
		}
		if current >= expect && bus.MetaLeader() != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restore: waiting for %d JetStream peers: %w", expect, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
