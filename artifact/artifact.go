// Package artifact keeps the mesh's artifacts: the executable files a host runs as is, in the
// object store mesh-artifacts (DESIGN §3, §12), one object per module and version. An
// artifact's SHA-256 digest is its identity: it is computed before the upload, kept with the
// object, named in every declaration that runs it, and checked on every read, so a damaged
// or replaced object is refused, never run.
package artifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the object store of artifacts.
const Bucket = "mesh-artifacts"

// Keep is how many of a module's newest versions are kept whether or not anything names
// them (DESIGN §3: kept while a declaration or the newest 3 versions name it).
const Keep = 3

// Metadata keys of an artifact's object.
const (
	metaModule  = "module"
	metaVersion = "version"
	metaDigest  = "sha256"
)

// Errors of the artifact store.
var (
	// ErrNotFound means no artifact of that module and version is stored.
	ErrNotFound = errors.New("artifact not stored")
	// ErrDigest means an artifact's content does not hash to the digest it is known by: it
	// was damaged or replaced, and must not be run.
	ErrDigest = errors.New("artifact digest mismatch")
	// ErrExists means the version is stored with other content: versions are immutable.
	ErrExists = errors.New("artifact version exists with other content")
)

// Info describes one stored artifact.
type Info struct {
	Module  string    `json:"module"`
	Version string    `json:"version"`
	Digest  string    `json:"digest"` // sha256:<hex>
	Size    uint64    `json:"size"`
	Stored  time.Time `json:"stored"`
}

// Name is the object name of module's version: <module>/<version>.
func Name(module, version string) string { return module + "/" + version }

// CheckVersion refuses a version that cannot name an artifact: 1 to 64 characters of
// letters, digits, '.', '-', '_' and '+', starting with a letter or digit (1.2.0, v3,
// 2026-12-01+build.7).
func CheckVersion(version string) error {
	ok := version != "" && len(version) <= 64
	for i, r := range version {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || !strings.ContainsRune(".-_+", r)) {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("version %q: 1 to 64 letters, digits, '.', '-', '_' or '+', starting with a letter or digit (e.g. 1.2.0)", version)
	}
	return nil
}

// Open creates or updates the bucket with replicas.
func Open(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.ObjectStore, error) {
	obs, err := ensure.ObjectStore(ctx, js, jetstream.ObjectStoreConfig{
		Bucket:      Bucket,
		Description: "meshnode: module artifacts, by module and version; the SHA-256 digest is the identity",
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("open object store %s: %w", Bucket, err)
	}
	return obs, nil
}

// Lookup opens the bucket without changing it: for readers (the CLI, a host).
func Lookup(ctx context.Context, js jetstream.JetStream) (jetstream.ObjectStore, error) {
	obs, err := js.ObjectStore(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: the mesh has no %s store yet; `meshnode artifact put` makes it", ErrNotFound, Bucket)
	}
	return obs, err
}

// ValidDigest reports whether d is a digest as FileDigest writes it: sha256: and 64 lower-case
// hex digits. A host names the artifact's file after it, so nothing else may pass.
func ValidDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != sha256.Size*2 {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// FileDigest returns the sha256:<hex> digest of the file at path and its size.
func FileDigest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}

// Put stores the file at path as module's version. The same content again is a no-op;
// other content under a stored version is ErrExists (versions are immutable: store it as a
// new version).
func Put(ctx context.Context, obs jetstream.ObjectStore, module, version, path string) (Info, error) {
	if !manifest.ValidName(module) {
		return Info{}, fmt.Errorf("module %q is not a module name", module)
	}
	if err := CheckVersion(version); err != nil {
		return Info{}, err
	}
	digest, _, err := FileDigest(path)
	if err != nil {
		return Info{}, err
	}
	if old, err := Stat(ctx, obs, module, version); err == nil {
		if old.Digest != digest {
			return Info{}, fmt.Errorf("%w: %s %s is stored with digest %s, the file has %s; store it as a new version", ErrExists, module, version, old.Digest, digest)
		}
		return old, nil
	} else if !errors.Is(err, ErrNotFound) {
		return Info{}, err
	}
	f, err := os.Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	oi, err := obs.Put(ctx, jetstream.ObjectMeta{
		Name:     Name(module, version),
		Metadata: map[string]string{metaModule: module, metaVersion: version, metaDigest: digest},
	}, f)
	if err != nil {
		return Info{}, fmt.Errorf("store %s %s: %w", module, version, err)
	}
	info, err := infoOf(oi)
	if err != nil {
		return Info{}, err
	}
	if info.Digest != digest {
		// The file changed while it was read twice: what is stored is not what was hashed.
		obs.Delete(ctx, oi.Name)
		return Info{}, fmt.Errorf("%s changed while it was stored; store it again", path)
	}
	return info, nil
}

// infoOf reads an object's artifact metadata.
func infoOf(oi *jetstream.ObjectInfo) (Info, error) {
	info := Info{Module: oi.Metadata[metaModule], Version: oi.Metadata[metaVersion], Digest: oi.Metadata[metaDigest], Size: oi.Size, Stored: oi.ModTime}
	if info.Module == "" || info.Version == "" || !ValidDigest(info.Digest) || oi.Name != Name(info.Module, info.Version) {
		return Info{}, fmt.Errorf("object %q in %s is not an artifact (no module, version and sha256 metadata matching its name)", oi.Name, Bucket)
	}
	return info, nil
}

// Stat returns what is stored of module's version, or ErrNotFound.
func Stat(ctx context.Context, obs jetstream.ObjectStore, module, version string) (Info, error) {
	oi, err := obs.GetInfo(ctx, Name(module, version))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return Info{}, fmt.Errorf("%w: %s %s; `meshnode artifact ls %s` lists the stored versions", ErrNotFound, module, version, module)
	}
	if err != nil {
		return Info{}, fmt.Errorf("look up artifact %s %s: %w", module, version, err)
	}
	return infoOf(oi)
}

// List returns the stored artifacts (of module, if not ""), by module and newest first.
func List(ctx context.Context, obs jetstream.ObjectStore, module string) ([]Info, error) {
	ois, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return []Info{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", Bucket, err)
	}
	out := []Info{}
	for _, oi := range ois {
		info, err := infoOf(oi)
		if err != nil || (module != "" && info.Module != module) {
			continue
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b Info) int {
		if c := strings.Compare(a.Module, b.Module); c != 0 {
			return c
		}
		return b.Stored.Compare(a.Stored)
	})
	return out, nil
}

// Fetch writes module's version from obs, the artifact store, to w, checking that its content
// hashes to digest: a mismatch is ErrDigest, and w then holds bytes that must not be used.
func Fetch(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, module, version, digest string, w io.Writer) error {
	h := sha256.New()
	err := ReadObject(ctx, js, obs, Bucket, Name(module, version), io.MultiWriter(w, h))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("%w: %s %s", ErrNotFound, module, version)
	}
	if errors.Is(err, jetstream.ErrDigestMismatch) {
		return fmt.Errorf("%w: %s %s: the stored chunks do not match the store's own digest", ErrDigest, module, version)
	}
	if err != nil {
		return fmt.Errorf("fetch artifact %s %s: %w", module, version, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("%w: %s %s hashes to %s, want %s; it was damaged or replaced, and is not run", ErrDigest, module, version, got, digest)
	}
	return nil
}

// ReadObject writes the object name of obs, the object store bucket, to w and checks it
// against the SHA-256 digest the store recorded with it (jetstream.ErrDigestMismatch when it
// does not match). It reads the chunks one by one, each the next message on the object's
// chunk subject (a direct get, under ctx), rather than with obs.Get: Get's push callback
// writes each chunk into a pipe, and a Get that fails after its first chunk arrived (a
// consumer create that times out under load) returns no reader, so nothing ever reads or
// closes that pipe and the callback's goroutine blocks for good (nats.go v1.55.0; goleak
// caught it in CI). An ordered consumer would not do either: its Fetch re-creates the
// consumer with a background context, retrying for ever. A chunk that is gone (the object
// was deleted or aged out while it was read) is an error, not a wait.
func ReadObject(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket, name string, w io.Writer) error {
	info, err := obs.GetInfo(ctx, name)
	if err != nil {
		return err
	}
	want, err := jetstream.DecodeObjectDigest(info.Digest)
	if err != nil {
		return fmt.Errorf("object %s: %w", name, err)
	}
	h := sha256.New()
	if info.Chunks > 0 {
		stream, err := js.Stream(ctx, "OBJ_"+bucket)
		if err != nil {
			return fmt.Errorf("object %s: %w", name, err)
		}
		out, subject, seq := io.MultiWriter(w, h), "$O."+bucket+".C."+info.NUID, uint64(1)
		for n := range info.Chunks {
			m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return fmt.Errorf("object %s: chunk %d of %d is gone (deleted or aged out while read)", name, n+1, info.Chunks)
			}
			if err != nil {
				return fmt.Errorf("object %s: chunk %d of %d: %w", name, n+1, info.Chunks, err)
			}
			if _, err := out.Write(m.Data); err != nil {
				return err
			}
			seq = m.Sequence + 1
		}
	}
	if !bytes.Equal(h.Sum(nil), want) {
		return fmt.Errorf("object %s: %w", name, jetstream.ErrDigestMismatch)
	}
	return nil
}

// Remove deletes module's version.
func Remove(ctx context.Context, obs jetstream.ObjectStore, module, version string) error {
	err := obs.Delete(ctx, Name(module, version))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("%w: %s %s", ErrNotFound, module, version)
	}
	return err
}

// Collect deletes the artifacts that neither are among their module's Keep newest nor named
// (in use: a deployment or a declaration names that module and version), and returns them.
func Collect(ctx context.Context, obs jetstream.ObjectStore, named func(module, version string) bool) ([]Info, error) {
	all, err := List(ctx, obs, "")
	if err != nil {
		return nil, err
	}
	var removed []Info
	newer := map[string]int{} // by module: how many newer versions were seen (List is newest first)
	for _, a := range all {
		newer[a.Module]++
		if newer[a.Module] <= Keep || named(a.Module, a.Version) {
			continue
		}
		if err := Remove(ctx, obs, a.Module, a.Version); err != nil && !errors.Is(err, ErrNotFound) {
			return removed, err
		}
		removed = append(removed, a)
	}
	return removed, nil
}
