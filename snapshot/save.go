package snapshot

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/provision"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/seats"
	"github.com/meshnode/meshnode/streammove"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options are what Save writes besides the streams, and how it reports.
type Options struct {
	MeshID   string // the mesh's id, as its nodes report it
	Operator string // the operator's public nkey; "" leaves it out
	Version  string // the meshnode version writing the file
	// Foundation is the mesh's foundation sealed under the barrier key (the vault's);
	// nil leaves it out.
	Foundation *api.SealedFoundation
	// AuditHeads are the nodes' audit-log heads, by node; nil leaves them out.
	AuditHeads map[string]api.AuditHead
	// Progress, when set, is called as each stream's snapshot is taken.
	Progress func(Stream)
}

// order ranks the mesh's streams as a restore takes them: what others name first (the
// registry of modules, the vault's sealed records, provisions, the nodes' declarations),
// then the seats' leases and their queues, the modules' own buckets, the dead letters and
// the events, and the artifacts, the bulk, last. -1 is a stream that is not the mesh's.
func order(name string) int {
	// Every bucket of the mesh's is named mesh-*: its own (registry.Bucket, vault.Bucket, …)
	// and each module's (manifest.KVBucket).
	const kv, obj = "KV_mesh-", "OBJ_mesh-"
	switch {
	case name == "KV_"+registry.Bucket:
		return 0
	case name == "KV_"+vault.Bucket:
		return 1
	case name == "KV_"+provision.Bucket:
		return 2
	case name == manifest.StateStreamName:
		return 3
	case name == "KV_"+seats.Bucket:
		return 4
	case strings.HasPrefix(name, manifest.SeatStreamName("")):
		return 5
	case strings.HasPrefix(name, kv):
		return 6
	case name == manifest.DeadStreamName:
		return 7
	case name == manifest.EventsStreamName:
		return 8
	case name == "OBJ_"+artifact.Bucket || strings.HasPrefix(name, obj):
		return 9
	}
	return -1
}

// meshStreams lists the mesh's streams in nc's account, in the order a restore takes them:
// read from the server, so every seat and bucket made since the binary was built is in.
func meshStreams(ctx context.Context, nc *nats.Conn) ([]string, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var names []string
	lister := js.StreamNames(ctx)
	for name := range lister.Name() {
		if order(name) >= 0 {
			names = append(names, name)
		}
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list the streams: %w", err)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(order(a), order(b)), strings.Compare(a, b)) })
	return names, nil
}

// Save writes a snapshot of the mesh's streams, read through nc (an operator's connection),
// to path: through path.tmp, synced and renamed, so path is either absent (or as it was) or
// whole. The mesh goes on serving: each stream is snapshotted on its own, one after the
// other. Each stream's snapshot is spooled beside path first, since the manifest that comes
// first in the file names each one's size and checksum. It overwrites path.
func Save(ctx context.Context, nc *nats.Conn, path string, opts Options) (Manifest, error) {
	man := Manifest{
		Kind: Kind, FormatVersion: FormatVersion, MeshnodeVersion: opts.Version,
		Created: time.Now().UTC(), MeshID: opts.MeshID, Operator: opts.Operator, Server: nc.ConnectedServerName(),
		Foundation: opts.Foundation, AuditHeads: opts.AuditHeads,
	}
	names, err := meshStreams(ctx, nc)
	if err != nil {
		return Manifest{}, err
	}
	if len(names) == 0 {
		return Manifest{}, fmt.Errorf("the account of %s holds none of the mesh's streams: connect to a node of the mesh as its operator", nc.ConnectedUrlRedacted())
	}
	spool, err := os.MkdirTemp(filepath.Dir(path), "."+filepath.Base(path)+".spool-*")
	if err != nil {
		return Manifest{}, fmt.Errorf("make a spool directory beside %s: %w", path, err)
	}
	defer os.RemoveAll(spool)
	for _, name := range names {
		s, err := spoolStream(ctx, nc, spool, name)
		var apiErr *server.ApiError
		if errors.As(err, &apiErr) && apiErr.ErrCode == uint16(server.JSStreamNotFoundErr) {
			continue // deleted since the list (a seat removed): no longer the mesh's
		}
		if err != nil {
			return Manifest{}, fmt.Errorf("snapshot stream %s: %w", name, err)
		}
		man.Streams = append(man.Streams, s)
		if opts.Progress != nil {
			opts.Progress(s)
		}
	}
	if err := ctx.Err(); err != nil {
		return Manifest{}, err // cancelled after the last stream: nothing is written
	}
	if err := writeFile(path, man, spool); err != nil {
		return Manifest{}, err
	}
	return man, nil
}

// spoolStream writes stream name's snapshot to spool/<name>.snap, hashing it.
func spoolStream(ctx context.Context, nc *nats.Conn, spool, name string) (Stream, error) {
	f, err := os.Create(filepath.Join(spool, name+".snap"))
	if err != nil {
		return Stream{}, err
	}
	defer f.Close()
	h := sha256.New()
	n := &counter{}
	s, err := streammove.SnapshotStream(ctx, nc, name, io.MultiWriter(f, h, n))
	if err != nil {
		return Stream{}, err
	}
	return Stream{Stream: s, Entry: entryName(name), Size: n.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// counter counts the bytes written to it.
type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// writeFile writes the archive of man and the spooled snapshots to path.tmp, syncs it,
// renames it to path and syncs the directory, so the rename outlives a crash. On an error
// path.tmp is removed.
func writeFile(path string, man Manifest, spool string) (err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	tw := tar.NewWriter(f)
	var sums bytes.Buffer
	add := func(name string, size int64, r io.Reader) (string, error) {
		hdr := &tar.Header{Name: name, Mode: 0o600, Size: size, ModTime: man.Created, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", err
		}
		h := sha256.New()
		if _, err := io.Copy(tw, io.TeeReader(r, h)); err != nil {
			return "", err
		}
		sum := hex.EncodeToString(h.Sum(nil))
		fmt.Fprintf(&sums, "%s  %s\n", sum, name)
		return sum, nil
	}
	b, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	if _, err := add(ManifestEntry, int64(len(b)), bytes.NewReader(b)); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	for _, s := range man.Streams {
		if err := addSpooled(add, spool, s); err != nil {
			return fmt.Errorf("write %s: %w", tmp, err)
		}
	}
	fmt.Fprintf(&sums, "%x  %s\n", sha256.Sum256(sums.Bytes()), SumsEntry)
	if err := tw.WriteHeader(&tar.Header{Name: SumsEntry, Mode: 0o600, Size: int64(sums.Len()), ModTime: man.Created, Typeflag: tar.TypeReg}); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if _, err := tw.Write(sums.Bytes()); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	return syncDir(filepath.Dir(path))
}

// addSpooled adds stream s's spooled snapshot, checking it is still the one the manifest
// names: a spool changed on disk meanwhile would otherwise be caught only by Open.
func addSpooled(add func(string, int64, io.Reader) (string, error), spool string, s Stream) error {
	f, err := os.Open(filepath.Join(spool, s.Name()+".snap"))
	if err != nil {
		return err
	}
	defer f.Close()
	sum, err := add(s.Entry, s.Size, f)
	if err != nil {
		return err
	}
	if sum != s.SHA256 {
		return fmt.Errorf("the spooled snapshot of %s changed on disk while it was written (SHA-256 %s, taken as %s): check the disk, and save again", s.Name(), sum, s.SHA256)
	}
	return nil
}

// syncDir syncs directory dir, so a rename in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
