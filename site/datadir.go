package site

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// A site's data dir is a node's (datadir): its bbolt store, which holds the site's record and
// its key's seed and locks the dir to one process, and its JetStream store.
const (
	recordKey = "site"      // Joined, as JSON
	seedKey   = "site-seed" // the site's nkey seed: its link's and its own connections' key
)

// Joined is a site's record of its enrolment.
type Joined struct {
	Name   string   `json:"name"`
	MeshID string   `json:"mesh_id"`
	Hub    []string `json:"hub"`          // the hub servers' leafnode URLs, as enrolment told them
	CA     []byte   `json:"ca,omitempty"` // the mesh's CA certificate (DER): the links' TLS trusts it
}

// ErrNotSite means a data dir holds no site.
var ErrNotSite = errors.New("the data dir holds no site")

// Join enrols the data dir in cfg as the site named cfg.Name of the mesh token names (a join
// token from `meshnode token create`), and keeps its record. The site's key is minted once and
// kept before it enrols, so a join that fails after the hub recorded it can be run again on the
// same data dir. A data dir that holds a node, or a site already enrolled, is refused.
func Join(ctx context.Context, cfg config.Config, token string) (*Joined, error) {
	if !config.ValidName(cfg.Name) {
		return nil, fmt.Errorf("%w: name %q: a site's name is lower-case letters, digits and '-', starting with a letter or digit, at most 63 characters", config.ErrInvalid, cfg.Name)
	}
	db, err := datadir.Open(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if j, err := load(db); err == nil {
		return nil, fmt.Errorf("%s is site %s of mesh %s already: start it with `meshnode run --data-dir %s`", cfg.DataDir, j.Name, j.MeshID, cfg.DataDir)
	}
	if _, err := genesis.New(db).Foundation(); !errors.Is(err, genesis.ErrNone) || datadir.CheckNoMeshData(db, cfg.DataDir) != nil && datadir.Value(db, seedKey) == "" {
		return nil, fmt.Errorf("%s holds a node or a mesh's data: a site joins with a fresh --data-dir", cfg.DataDir)
	}
	key, err := siteKey(db)
	if err != nil {
		return nil, err
	}
	pub, _ := key.PublicKey()
	xkp, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, err
	}
	e, err := vault.EnrolSite(ctx, token, cfg.Name, pub, xkp)
	if err != nil {
		return nil, err
	}
	if len(e.Leaf) == 0 {
		return nil, fmt.Errorf("mesh %s told no leafnode URL to link to: set leaf-addr on its servers", e.MeshID)
	}
	j := &Joined{Name: cfg.Name, MeshID: e.MeshID, Hub: e.Leaf, CA: e.CA}
	b, _ := json.Marshal(j)
	if err := datadir.PutValue(db, recordKey, string(b)); err != nil {
		return nil, fmt.Errorf("keep the site's record: %w", err)
	}
	return j, nil
}

// siteKey is the data dir's site key: the one kept, or a new one, kept before it is used.
func siteKey(db *bolt.DB) (nkeys.KeyPair, error) {
	if seed := datadir.Value(db, seedKey); seed != "" {
		return nkeys.FromSeed([]byte(seed))
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	if err := datadir.PutValue(db, seedKey, string(seed)); err != nil {
		return nil, fmt.Errorf("keep the site's key: %w", err)
	}
	return kp, nil
}

func load(db *bolt.DB) (*Joined, error) {
	raw := datadir.Value(db, recordKey)
	if raw == "" {
		return nil, ErrNotSite
	}
	var j Joined
	if err := json.Unmarshal([]byte(raw), &j); err != nil {
		return nil, fmt.Errorf("the site's record: %w", err)
	}
	return &j, nil
}

// Held is a site's data dir, open: its record and key, and the store that locks it.
type Held struct {
	Joined
	Key nkeys.KeyPair
	db  *bolt.DB
}

// Load opens the site in dataDir (ErrNotSite when it holds none); Close releases it.
func Load(dataDir string) (*Held, error) {
	db, err := datadir.Open(dataDir)
	if err != nil {
		return nil, err
	}
	j, err := load(db)
	if err == nil && datadir.Value(db, seedKey) == "" {
		err = errors.New("the site's record has no key beside it")
	}
	var kp nkeys.KeyPair
	if err == nil {
		kp, err = siteKey(db)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Held{Joined: *j, Key: kp, db: db}, nil
}

// Store is the data dir's store, which holds the site's audit log (Config.DB).
func (h *Held) Store() *bolt.DB { return h.db }

// Close releases the data dir.
func (h *Held) Close() error { return h.db.Close() }

// TLS is the link's TLS, trusting the mesh's CA; nil when the hub's leafnode URLs are plain.
func (j *Joined) TLS() (*tls.Config, error) {
	if len(j.CA) == 0 || !slices.ContainsFunc(j.Hub, func(u string) bool { return strings.HasPrefix(u, "tls://") }) {
		return nil, nil
	}
	pool, err := meshca.PoolOf(j.CA)
	if err != nil {
		return nil, fmt.Errorf("the mesh's CA certificate in the site's record: %w", err)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
