package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/genesis"
	bolt "go.etcd.io/bbolt"
)

// File names inside the data dir.
const (
	storeFile = "meshnode.db"
	// OperatorSeedFile is the operator's nkey seed (0600): the CLI's default credential.
	OperatorSeedFile = "operator.nk"
	jsDir            = "jetstream"
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
	// ErrCorruptStore means the store file could not be read as a bbolt database.
	ErrCorruptStore = errors.New("store file is corrupt")
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

// openStore opens (creating if needed) the bbolt file in dir, turning bbolt's failures into
// errors that say what to do. bbolt may panic on some corrupt files; that becomes an error too.
func openStore(dir string) (db *bolt.DB, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w; choose a writable --data-dir", dir, err)
	}
	if err := checkWritable(dir); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, storeFile)
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("open %s: %w (%v); move it aside to start afresh, or restore it from a backup", path, ErrCorruptStore, r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: storeOpenTimeout})
	switch {
	case errors.Is(err, bolt.ErrTimeout):
		return nil, fmt.Errorf("open %s: %w; stop it (or use `meshnode status --data-dir %s`), or choose another --data-dir", path, ErrDataDirInUse, dir)
	case errors.Is(err, bolt.ErrInvalid), errors.Is(err, bolt.ErrVersionMismatch), errors.Is(err, bolt.ErrChecksum):
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

// loadIdentity reads the node's identity from its store: the foundation genesis (or an
// enrolment) kept there, and the operator's key once the vault has minted it. On a store
// without a mesh, and with create set, it runs genesis for node name, expecting expect
// servers.
func loadIdentity(db *bolt.DB, dir, name string, create bool, expect int) (Identity, *genesis.Foundation, error) {
	g := genesis.New(db)
	f, err := g.Foundation()
	switch {
	case errors.Is(err, genesis.ErrNone) && !create:
		return Identity{}, nil, fmt.Errorf("%w: %s", ErrNoIdentity, dir)
	case errors.Is(err, genesis.ErrNone):
		if f, err = g.Begin(name, expect); err != nil {
			return Identity{}, nil, err
		}
	case err != nil:
		return Identity{}, nil, fmt.Errorf("read foundation: %w (%v); move %s aside to start afresh", ErrCorruptStore, err, filepath.Join(dir, storeFile))
	}
	if f.Node != name {
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
	err = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketNode); b != nil {
			id.OperatorKey = string(b.Get([]byte("operator-key")))
		}
		return nil
	})
	return id, f, err
}

// keepOperator records the operator's public key (its seed went to operator.nk).
func keepOperator(db *bolt.DB, pub string) error {
	return db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketNode)
		if err != nil {
			return err
		}
		return b.Put([]byte("operator-key"), []byte(pub))
	})
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// writeFileAtomic writes data to path through a temporary file and a rename, so a crash
// leaves either the old file or the new one.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
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
	db, err := openStore(cfg.DataDir)
	if err != nil {
		return nil, genesis.Record{}, err
	}
	defer db.Close()
	g := genesis.New(db)
	f, err := g.Begin(cfg.Name, expect)
	if err != nil {
		return nil, genesis.Record{}, err
	}
	r, err := g.Record()
	return f, r, err
}

// GenesisRecord returns the genesis record of the node (ErrNone for an enrolled node).
func (n *Node) GenesisRecord() (genesis.Record, error) { return genesis.New(n.db).Record() }
