// Package datadir is what a node keeps in its data dir: the bbolt store with the node's
// identity and the mesh's foundation, the files beside it (the operator's seed, node.json,
// the JetStream store's directory), and the errors a user meets opening one.
package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/genesis"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// File names inside the data dir.
const (
	StoreFile = "meshnode.db"
	// OperatorSeedFile is the operator's nkey seed (0600): the CLI's default credential.
	OperatorSeedFile = "operator.nk"
	JetStreamDir     = "jetstream"
)

// storeOpenTimeout bounds the wait for bbolt's file lock: a running node holds it.
const storeOpenTimeout = time.Second

var bucketNode = []byte("node")

// Errors a user can meet when opening a data dir.
var (
	// ErrDataDirInUse means another process (a running node) holds the data dir's store.
	ErrDataDirInUse = errors.New("data dir is in use by a running meshnode")
	// ErrNameMismatch means the data dir belongs to a node of another name.
	ErrNameMismatch = errors.New("data dir belongs to another node")
	// ErrNoIdentity means the data dir holds no node and the caller asked not to create one.
	ErrNoIdentity = errors.New("data dir holds no node identity")
	// ErrCorruptStore means the store file could not be read as a bbolt database, or holds
	// no node while the data dir holds a mesh's data: the store is damaged.
	ErrCorruptStore = errors.New("store file is corrupt")
	// ErrMeshData means genesis was asked to create a mesh in a data dir that holds data of
	// one (a store, a JetStream store, the operator's seed): it would overwrite them.
	ErrMeshData = errors.New("data dir holds mesh data")
)

// Identity is who a node is: kept in its store, unchanged across restarts.
type Identity struct {
	Name      string    // node name, the NATS server name
	MeshID    string    // the mesh this node belongs to
	Created   time.Time // when the identity was made
	PublicKey string    // the node's nkey public key (the seed is in the store, 0600)
	// OperatorKey is the operator's nkey public key; its seed is operator.nk, 0600.
	OperatorKey string
}

// Open opens (creating if needed) the bbolt file in dir, turning bbolt's failures into
// errors that say what to do. bbolt may panic on some corrupt files; that becomes an error too.
func Open(dir string) (db *bolt.DB, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w; choose a writable --data-dir", dir, err)
	}
	if err := checkWritable(dir); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, StoreFile)
	// bbolt makes a new database of a zero-length file: a store truncated by a full disk
	// or a bad copy would pass for a data dir without a mesh, and genesis would run over the
	// mesh's JetStream store and operator seed.
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
		return nil, fmt.Errorf("open %s: %w: the file is empty, so the store is damaged; restore it from a backup, or move the data dir aside to start afresh (genesis over it would overwrite the mesh's data)", path, ErrCorruptStore)
	}
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("open %s: %w (%v); move it aside to start afresh, or restore it from a backup", path, ErrCorruptStore, r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: storeOpenTimeout})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, fmt.Errorf("open %s: %w; stop it (or use `meshnode status --data-dir %s`), or choose another --data-dir", path, ErrDataDirInUse, dir)
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrVersionMismatch), errors.Is(err, bolterrors.ErrChecksum):
		return nil, fmt.Errorf("open %s: %w (%v); move it aside to start afresh, or restore it from a backup", path, ErrCorruptStore, err)
	case err != nil:
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return db, nil
}

// checkWritable proves dir accepts a new file: root ignores permission bits, but not a
// read-only mount or a path that is not a directory.
func checkWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fmt.Errorf("data dir %s is not writable: %w; fix its permissions or choose another --data-dir", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// LoadIdentity reads the node's identity from its store (a name not given — the host
// name's default — yields to the one the store holds): the foundation genesis (or an
// enrolment) kept there, and the operator's key once the vault has minted it. On a store
// without a mesh, and with create set, it runs genesis for node name, expecting expect
// servers.
func LoadIdentity(db *bolt.DB, dir, name string, nameGiven, create bool, expect int) (Identity, *genesis.Foundation, error) {
	g := genesis.New(db)
	f, err := g.Foundation()
	switch {
	case errors.Is(err, genesis.ErrNone) && !create:
		if found := meshData(db, dir); len(found) > 0 {
			return Identity{}, nil, fmt.Errorf("%w: %s holds no node, yet %s holds a mesh's data (%s): the store is damaged; restore %s from a backup (do not run genesis here: it would overwrite them)",
				ErrCorruptStore, filepath.Join(dir, StoreFile), dir, strings.Join(found, ", "), StoreFile)
		}
		return Identity{}, nil, fmt.Errorf("%w: %s", ErrNoIdentity, dir)
	case errors.Is(err, genesis.ErrNone):
		if err := CheckNoMeshData(db, dir); err != nil {
			return Identity{}, nil, err
		}
		if f, err = g.Begin(name, expect); err != nil {
			return Identity{}, nil, err
		}
	case err != nil:
		return Identity{}, nil, fmt.Errorf("read foundation: %w (%v); move %s aside to start afresh", ErrCorruptStore, err, filepath.Join(dir, StoreFile))
	}
	if f.Node != name && nameGiven {
		return Identity{}, nil, fmt.Errorf("%w: %s holds node %q, not %q; run with --name %s, or choose a fresh --data-dir for %s",
			ErrNameMismatch, dir, f.Node, name, f.Node, name)
	}
	kp, err := f.NodeKey()
	if err != nil {
		return Identity{}, nil, fmt.Errorf("node key: %w", err)
	}
	id := Identity{Name: f.Node, MeshID: f.MeshID}
	id.PublicKey, _ = kp.PublicKey()
	if r, err := g.Record(); err == nil {
		id.Created = r.Created
	}
	id.OperatorKey = Value(db, "operator-key")
	return id, f, nil
}

// meshData lists what of a mesh the data dir holds besides a node in its store: a JetStream
// store, the operator's seed, and a store that holds anything at all. A bbolt file without a
// single bucket (what `run` on an empty data dir leaves) is no mesh data.
func meshData(db *bolt.DB, dir string) []string {
	var found []string
	if fi, err := os.Stat(filepath.Join(dir, JetStreamDir)); err == nil {
		what := JetStreamDir + "/ (a JetStream store)"
		if !fi.IsDir() {
			what = JetStreamDir + " (where the JetStream store goes)"
		}
		found = append(found, what)
	}
	if _, err := os.Lstat(filepath.Join(dir, OperatorSeedFile)); err == nil {
		found = append(found, OperatorSeedFile+" (the operator's seed)")
	}
	var buckets []string
	db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			buckets = append(buckets, string(name))
			return nil
		})
	})
	if len(buckets) > 0 {
		found = append(found, fmt.Sprintf("%s with buckets %s but no node", StoreFile, strings.Join(buckets, ", ")))
	}
	return found
}

// CheckNoMeshData refuses genesis on a data dir that holds a mesh's data: it would
// overwrite the operator's seed and start a bus over another mesh's JetStream store.
func CheckNoMeshData(db *bolt.DB, dir string) error {
	found := meshData(db, dir)
	if len(found) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s holds %s, but no node in %s; genesis refuses to run over them: restore %s from a backup and use `meshnode run`, or choose a fresh --data-dir for a new mesh (or move those aside)",
		ErrMeshData, dir, strings.Join(found, ", "), StoreFile, StoreFile)
}

// KeepOperator records the operator's public key (its seed went to operator.nk).
func KeepOperator(db *bolt.DB, pub string) error { return PutValue(db, "operator-key", pub) }

// PutValue records one of the node's own values in its store.
func PutValue(db *bolt.DB, key, value string) error {
	return db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketNode)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), []byte(value))
	})
}

// MarkNow records that something happened to the node, and when: a flag with its time.
func MarkNow(db *bolt.DB, key string) error {
	return PutValue(db, key, time.Now().UTC().Format(time.RFC3339))
}

// Value reads one of the node's own values ("" when it has none).
func Value(db *bolt.DB, key string) string {
	var v string
	db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketNode); b != nil {
			v = string(b.Get([]byte(key)))
		}
		return nil
	})
	return v
}

// WriteFileAtomic writes data to path through a temporary file and a rename, so a crash
// leaves either the old file or the new one.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Prepare runs genesis on cfg's data dir without raising the bus: for a mesh of 3 or more,
// whose first bus must wait until the founding nodes meet. It returns the foundation and
// the genesis record.
func Prepare(cfg config.Config, expect int) (*genesis.Foundation, genesis.Record, error) {
	if err := cfg.Validate(); err != nil {
		return nil, genesis.Record{}, err
	}
	db, err := Open(cfg.DataDir)
	if err != nil {
		return nil, genesis.Record{}, err
	}
	defer db.Close()
	g := genesis.New(db)
	_, rerr := g.Record()
	_, ferr := g.Foundation()
	if errors.Is(rerr, genesis.ErrNone) && errors.Is(ferr, genesis.ErrNone) {
		// No mesh in the store (one there is Begin's to refuse, naming it): nor anywhere else.
		if err := CheckNoMeshData(db, cfg.DataDir); err != nil {
			return nil, genesis.Record{}, err
		}
	}
	f, err := g.Begin(cfg.Name, expect)
	if err != nil {
		return nil, genesis.Record{}, err
	}
	r, err := g.Record()
	return f, r, err
}

// PrepareRestore is Prepare for a mesh restored from a snapshot (genesis.Restore): it
// refuses a data dir that holds a mesh or a mesh's data, saying which, and keeps the
// operator's public key the snapshot names (the restored registry's). Call it only once the
// snapshot and the recovery key are checked: it is the first write to the data dir.
func PrepareRestore(cfg config.Config, expect int, from genesis.Restored, operator string) (*genesis.Foundation, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	db, err := Open(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	g := genesis.New(db)
	if r, err := g.Record(); err == nil {
		return nil, fmt.Errorf("%w %s: restoring into it would overwrite it; stop that mesh's node and restore into a fresh --data-dir (a running mesh is never restored over)", genesis.ErrExists, r.MeshID)
	}
	if f, err := g.Foundation(); err == nil {
		return nil, fmt.Errorf("%w %s (it joined it): restoring into it would overwrite it; restore into a fresh --data-dir", genesis.ErrExists, f.MeshID)
	}
	if err := CheckNoMeshData(db, cfg.DataDir); err != nil {
		return nil, err
	}
	if operator != "" {
		if err := KeepOperator(db, operator); err != nil {
			return nil, err
		}
	}
	return g.Restore(cfg.Name, expect, from)
}
