package node

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// File names inside the data dir.
const (
	storeFile = "meshnode.db"
	seedFile  = "node.nk"
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
	PublicKey string    // the node's nkey public key (the seed is in node.nk, 0600)
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

// loadIdentity reads the node's identity from db. If there is none and create is set, it
// makes one named name, with a new mesh id and nkey, and writes the seed to dir.
func loadIdentity(db *bolt.DB, dir, name string, create bool) (Identity, nkeys.KeyPair, error) {
	var id Identity
	var found bool
	err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketNode)
		if b == nil {
			return nil
		}
		found = true
		id.Name = string(b.Get([]byte("name")))
		id.MeshID = string(b.Get([]byte("mesh-id")))
		id.PublicKey = string(b.Get([]byte("public-key")))
		id.OperatorKey = string(b.Get([]byte("operator-key")))
		return id.Created.UnmarshalText(b.Get([]byte("created")))
	})
	if err != nil {
		return Identity{}, nil, fmt.Errorf("read identity: %w (%v); move %s aside to start afresh", ErrCorruptStore, err, filepath.Join(dir, storeFile))
	}
	seedPath := filepath.Join(dir, seedFile)
	if found {
		if id.Name != name {
			return Identity{}, nil, fmt.Errorf("%w: %s holds node %q, not %q; run with --name %s, or choose a fresh --data-dir for %s",
				ErrNameMismatch, dir, id.Name, name, id.Name, name)
		}
		kp, err := readSeed(seedPath, id.PublicKey)
		if err != nil {
			return Identity{}, nil, err
		}
		if id.OperatorKey == "" {
			// A node made before the operator credential existed gets one now.
			if id.OperatorKey, err = mintOperator(db, dir); err != nil {
				return Identity{}, nil, err
			}
		}
		return id, kp, nil
	}
	if !create {
		return Identity{}, nil, fmt.Errorf("%w: %s", ErrNoIdentity, dir)
	}

	kp, err := nkeys.CreateServer()
	if err != nil {
		return Identity{}, nil, fmt.Errorf("create node key: %w", err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	if err := writeFileAtomic(seedPath, seed, 0o600); err != nil {
		return Identity{}, nil, fmt.Errorf("write node seed: %w", err)
	}
	meshID := make([]byte, 16)
	if _, err := rand.Read(meshID); err != nil {
		return Identity{}, nil, err
	}
	id = Identity{Name: name, MeshID: hex.EncodeToString(meshID), Created: time.Now().UTC().Truncate(time.Second), PublicKey: pub}
	created, _ := id.Created.MarshalText()
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bucketNode)
		if err != nil {
			return err
		}
		for k, v := range map[string][]byte{
			"name": []byte(id.Name), "mesh-id": []byte(id.MeshID),
			"public-key": []byte(id.PublicKey), "created": created,
		} {
			if err := b.Put([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Identity{}, nil, fmt.Errorf("write identity: %w", err)
	}
	if id.OperatorKey, err = mintOperator(db, dir); err != nil {
		return Identity{}, nil, err
	}
	return id, kp, nil
}

// mintOperator mints the operator's identity, writes its seed to operator.nk (0600) and its
// public key to the store.
func mintOperator(db *bolt.DB, dir string) (string, error) {
	kp, err := vault.MintUser()
	if err != nil {
		return "", err
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	if err := writeFileAtomic(filepath.Join(dir, OperatorSeedFile), append(seed, '\n'), 0o600); err != nil {
		return "", fmt.Errorf("write operator seed: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketNode).Put([]byte("operator-key"), []byte(pub))
	})
	if err != nil {
		return "", fmt.Errorf("write operator key: %w", err)
	}
	return pub, nil
}

// readSeed loads the node's nkey seed and checks it matches the identity's public key.
func readSeed(path, wantPub string) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read node seed: %w; the data dir is incomplete, restore %s from a backup", err, path)
	}
	kp, err := nkeys.FromSeed(trimSpace(seed))
	if err != nil {
		return nil, fmt.Errorf("node seed %s: %w; restore it from a backup", path, err)
	}
	if pub, _ := kp.PublicKey(); pub != wantPub {
		return nil, fmt.Errorf("node seed %s belongs to %s, not to this node (%s); restore the right file from a backup", path, pub, wantPub)
	}
	return kp, nil
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
