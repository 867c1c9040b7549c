package genesis

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// Errors of genesis.
var (
	// ErrTwoServers refuses a mesh of two: JetStream needs a majority, so losing either of
	// two servers stops it.
	ErrTwoServers = errors.New("a mesh of 2 servers is refused: losing either stops JetStream (it needs a majority); use --expect 1 for a single node or 3 or more")
	// ErrExists means the data dir already belongs to a mesh.
	ErrExists = errors.New("data dir already belongs to a mesh")
	// ErrHandedOff means genesis has handed off to the vault: it mints nothing more.
	ErrHandedOff = errors.New("genesis has handed off to the vault and mints nothing more")
	// ErrNone means the data dir holds no genesis and no enrolment: no mesh at all.
	ErrNone = errors.New("data dir holds no mesh")
)

var (
	bucketGenesis    = []byte("genesis")
	bucketFoundation = []byte("foundation")
	keyRecord        = []byte("record")
)

// Foundation is what genesis mints: the bus's own credentials and the vault's own. It lives
// in the node's bbolt file (0600) and nowhere else; it never enters a stream.
type Foundation struct {
	MeshID string `json:"mesh_id"`
	// Node is the node's name; NodeSeed its nkey seed (a server key: its identity on the
	// bus and the raft); NodeXKeySeed its X25519 seed (what the vault seals to it).
	Node         string `json:"node"`
	NodeSeed     []byte `json:"node_seed"`
	NodeXKeySeed []byte `json:"node_xkey_seed"`
	// RouteSecret authenticates routes between the mesh's servers.
	RouteSecret []byte `json:"route_secret"`
	// GossipKey encrypts membership gossip (memberlist SecretKey, 32 bytes).
	GossipKey []byte `json:"gossip_key"`
	// BarrierKey encrypts the vault's records (AES-256-GCM, 32 bytes).
	BarrierKey []byte `json:"barrier_key"`
	// VaultSeed is the vault's own bus identity (an nkey user seed). Empty on a node that
	// joined: only the genesis node holds the vault's own credentials until enrolment
	// delivers the barrier key.
	VaultSeed []byte `json:"vault_seed,omitempty"`
	// Expect is the number of servers the mesh was founded with: 1, or 3 or more.
	Expect int `json:"expect"`
	// Seeds are gossip addresses to contact when forming or rejoining the mesh.
	Seeds []string `json:"seeds,omitempty"`
	// Formed is set once this node has been part of the formed mesh: a restart then waits
	// for a majority of the servers, not for all of them.
	Formed bool `json:"formed,omitempty"`
	// Members are the servers the mesh formed with.
	Members []string `json:"members,omitempty"`
	// GrowTo is set on a single node growing into a mesh of that many servers, and GrowPhase
	// says how far it got (node/grow.go); both are cleared once it is a mesh.
	GrowTo    int    `json:"grow_to,omitempty"`
	GrowPhase string `json:"grow_phase,omitempty"`
	// AwaitGrowth is set on a node that joined a growing single node, or founds a mesh
	// being restored from a snapshot: before it opens the mesh's buckets and streams it
	// waits for the growing (restoring) node to restore them.
	AwaitGrowth bool `json:"await_growth,omitempty"`
	// Restoring is set on the node genesis --from-snapshot made, until its first start has
	// restored every stream of the snapshot into the mesh (snapshot.Resume).
	Restoring *Restoring `json:"restoring,omitempty"`
}

// Restoring names the snapshot a new mesh is restored from.
type Restoring struct {
	// File is its path, absolute: the file is read, never changed. "" on a founding node of
	// a mesh of 3 or more, which waits for the genesis node to restore it.
	File string `json:"file,omitempty"`
	// SHA256 is the SHA-256 of its manifest (hex): the file read at the start must be the
	// one genesis checked.
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"` // when the snapshot was saved
}

// Minted is one credential in the genesis record: what, and a fingerprint (never a value).
type Minted struct {
	What        string `json:"what"`
	Fingerprint string `json:"fingerprint"` // a public key, or sha256 of a secret's value
}

// Record is what the data dir remembers of genesis.
type Record struct {
	MeshID  string    `json:"mesh_id"`
	Node    string    `json:"node"`
	Expect  int       `json:"expect"`
	Created time.Time `json:"created"`
	Minted  []Minted  `json:"minted"`
	// HandedOff is when the vault took over; zero before.
	HandedOff time.Time `json:"handed_off,omitzero"`
	// Restored names the snapshot a restored mesh began from; nil for a new mesh.
	Restored *Restoring `json:"restored,omitempty"`
}

// Restored is the mesh part of a foundation a snapshot brings: its id, and the keys its
// sealed foundation and the operator's recovery key hold.
type Restored struct {
	MeshID      string
	RouteSecret []byte
	GossipKey   []byte
	BarrierKey  []byte
	VaultSeed   []byte
	From        Restoring
}

// Genesis is the genesis state of one data dir's store.
type Genesis struct{ db *bolt.DB }

// New returns the genesis state kept in db.
func New(db *bolt.DB) *Genesis { return &Genesis{db: db} }

// Record returns the genesis record; ErrNone if there is none.
func (g *Genesis) Record() (Record, error) {
	var r Record
	err := g.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketGenesis)
		if b == nil || b.Get(keyRecord) == nil {
			return ErrNone
		}
		return json.Unmarshal(b.Get(keyRecord), &r)
	})
	return r, err
}

// Foundation returns the foundation kept in the store; ErrNone if there is none.
func (g *Genesis) Foundation() (*Foundation, error) {
	var f Foundation
	err := g.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketFoundation)
		if b == nil || b.Get(keyRecord) == nil {
			return ErrNone
		}
		return json.Unmarshal(b.Get(keyRecord), &f)
	})
	if err != nil {
		return nil, err
	}
	return &f, nil
}

// Begin mints the foundation of a new mesh for node name, expecting expect servers, and
// keeps it with the genesis record. It refuses a data dir that already belongs to a mesh, a
// mesh of two, and — once handed off — anything at all.
func (g *Genesis) Begin(name string, expect int) (*Foundation, error) {
	switch {
	case expect == 2:
		return nil, ErrTwoServers
	case expect < 1:
		return nil, fmt.Errorf("--expect %d: a mesh has 1 server, or 3 or more", expect)
	}
	if r, err := g.Record(); err == nil {
		if !r.HandedOff.IsZero() {
			return nil, fmt.Errorf("%w (mesh %s, handed off %s); use `meshnode run` to start it, or a fresh --data-dir for a new mesh", ErrHandedOff, r.MeshID, r.HandedOff.Format(time.RFC3339))
		}
		return nil, fmt.Errorf("%w %s; use `meshnode run` to start it, or a fresh --data-dir for a new mesh", ErrExists, r.MeshID)
	} else if !errors.Is(err, ErrNone) {
		return nil, err
	}
	if _, err := g.Foundation(); err == nil {
		return nil, fmt.Errorf("%w (it joined one); use `meshnode run`, or a fresh --data-dir for a new mesh", ErrExists)
	}
	f, minted, err := mint(name)
	if err != nil {
		return nil, err
	}
	f.Expect = expect
	return f, g.keep(f, Record{MeshID: f.MeshID, Node: name, Expect: expect, Created: time.Now().UTC(), Minted: minted})
}

// Restore is Begin for a mesh restored from a snapshot: the node's keys are minted, the
// mesh's id and keys are the snapshot's, and the foundation is marked Restoring until the
// node's first start has restored the snapshot's streams. Genesis is recorded handed off
// already: the vault took over when the mesh was first made, and the restored registry
// names its operator, whose operator.nk goes on working — none is minted.
func (g *Genesis) Restore(name string, expect int, from Restored) (*Foundation, error) {
	if expect == 2 {
		return nil, ErrTwoServers
	}
	if _, err := g.Record(); !errors.Is(err, ErrNone) {
		return nil, fmt.Errorf("%w; restore into a fresh --data-dir", ErrExists)
	}
	if _, err := g.Foundation(); !errors.Is(err, ErrNone) {
		return nil, fmt.Errorf("%w (it joined one); restore into a fresh --data-dir", ErrExists)
	}
	f, minted, err := mint(name)
	if err != nil {
		return nil, err
	}
	f.MeshID, f.RouteSecret, f.GossipKey, f.BarrierKey, f.VaultSeed = from.MeshID, from.RouteSecret, from.GossipKey, from.BarrierKey, from.VaultSeed
	f.Expect, f.Restoring = expect, &from.From
	vaultKey, err := f.VaultKey()
	if err != nil {
		return nil, fmt.Errorf("the snapshot's vault seed: %w", err)
	}
	vaultPub, _ := vaultKey.PublicKey()
	// The node's keys are new; the rest is the snapshot's.
	minted = append(minted[1:3:3], []Minted{
		{"mesh id (restored)", f.MeshID},
		{"route credential (restored)", digest(f.RouteSecret)},
		{"gossip key (restored)", digest(f.GossipKey)},
		{"barrier key (restored)", digest(f.BarrierKey)},
		{"vault identity (restored)", vaultPub},
	}...)
	now := time.Now().UTC()
	return f, g.keep(f, Record{MeshID: f.MeshID, Node: name, Expect: expect, Created: now, Minted: minted, HandedOff: now, Restored: &from.From})
}

// keep stores a new mesh's foundation and genesis record together.
func (g *Genesis) keep(f *Foundation, r Record) error {
	err := g.db.Update(func(tx *bolt.Tx) error {
		if err := put(tx, bucketFoundation, f); err != nil {
			return err
		}
		return put(tx, bucketGenesis, r)
	})
	if err != nil {
		return fmt.Errorf("keep foundation: %w", err)
	}
	return nil
}

// HandOff records that the vault has taken over. After it, Begin mints nothing.
func (g *Genesis) HandOff() error {
	return g.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketGenesis)
		if b == nil || b.Get(keyRecord) == nil {
			return ErrNone
		}
		var r Record
		if err := json.Unmarshal(b.Get(keyRecord), &r); err != nil {
			return err
		}
		if !r.HandedOff.IsZero() {
			return nil
		}
		r.HandedOff = time.Now().UTC()
		return put(tx, bucketGenesis, r)
	})
}

// Keep stores a foundation delivered by enrolment (a node that joins an existing mesh).
func (g *Genesis) Keep(f *Foundation) error {
	return g.db.Update(func(tx *bolt.Tx) error { return put(tx, bucketFoundation, f) })
}

func put(tx *bolt.Tx, bucket []byte, v any) error {
	b, err := tx.CreateBucketIfNotExists(bucket)
	if err != nil {
		return err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(keyRecord, data)
}

// mint makes the foundation: exactly the bus's own credentials and the vault's own.
func mint(node string) (*Foundation, []Minted, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, nil, err
	}
	f := &Foundation{MeshID: hex.EncodeToString(id), Node: node}
	nodeKey, err := nkeys.CreateServer()
	if err != nil {
		return nil, nil, err
	}
	xkey, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, nil, err
	}
	vaultKey, err := nkeys.CreateUser()
	if err != nil {
		return nil, nil, err
	}
	f.NodeSeed, _ = nodeKey.Seed()
	f.NodeXKeySeed, _ = xkey.Seed()
	f.VaultSeed, _ = vaultKey.Seed()
	for _, p := range []*[]byte{&f.RouteSecret, &f.GossipKey, &f.BarrierKey} {
		*p = make([]byte, 32)
		if _, err := rand.Read(*p); err != nil {
			return nil, nil, err
		}
	}
	nodePub, _ := nodeKey.PublicKey()
	xPub, _ := xkey.PublicKey()
	vaultPub, _ := vaultKey.PublicKey()
	minted := []Minted{
		{"mesh id", f.MeshID},
		{"node nkey", nodePub},
		{"node xkey", xPub},
		{"route credential", digest(f.RouteSecret)},
		{"gossip key", digest(f.GossipKey)},
		{"barrier key", digest(f.BarrierKey)},
		{"vault identity", vaultPub},
	}
	return f, minted, nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// NodeKey returns the node's nkey.
func (f *Foundation) NodeKey() (nkeys.KeyPair, error) { return nkeys.FromSeed(f.NodeSeed) }

// NodeXKey returns the node's xkey.
func (f *Foundation) NodeXKey() (nkeys.KeyPair, error) { return nkeys.FromSeed(f.NodeXKeySeed) }

// VaultKey returns the vault's bus identity.
func (f *Foundation) VaultKey() (nkeys.KeyPair, error) { return nkeys.FromSeed(f.VaultSeed) }

// FoundingPrefix starts every founding token.
const FoundingPrefix = "MNF1."

// Founding is the founding token of a mesh of 3 or more (DESIGN §9): before the founding
// nodes meet there is no vault, so genesis hands them the bus's own foundation directly —
// the mesh id, where to gossip, the gossip key and the route credential. It is refused once
// the mesh has formed and the vault has taken over; later joins use vault-minted tokens.
type Founding struct {
	MeshID      string   `json:"mesh_id"`
	Expect      int      `json:"expect"`
	Gossip      []string `json:"gossip"`
	GossipKey   []byte   `json:"gossip_key"`
	RouteSecret []byte   `json:"route_secret"`
	// Restoring names the snapshot the genesis node restores the mesh from (its file left
	// out): the founding nodes wait for it to bring the mesh's streams, and their audit logs
	// begin by naming it.
	Restoring *Restoring `json:"restoring,omitempty"`
}

// FoundingToken returns the founding token of f, gossiping with seeds.
func (f *Foundation) FoundingToken(expect int, seeds []string) string {
	ft := Founding{MeshID: f.MeshID, Expect: expect, Gossip: seeds, GossipKey: f.GossipKey, RouteSecret: f.RouteSecret}
	if f.Restoring != nil {
		ft.Restoring = &Restoring{SHA256: f.Restoring.SHA256, Created: f.Restoring.Created}
	}
	b, _ := json.Marshal(ft)
	return FoundingPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// ParseFounding decodes a founding token.
func ParseFounding(s string) (Founding, error) {
	var f Founding
	raw, ok := strings.CutPrefix(strings.TrimSpace(s), FoundingPrefix)
	if !ok {
		return f, fmt.Errorf("not a founding token: it starts with %q (genesis --expect 3 prints one)", FoundingPrefix)
	}
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil || json.Unmarshal(b, &f) != nil || f.MeshID == "" {
		return f, errors.New("founding token is damaged: copy it whole")
	}
	return f, nil
}

// Found makes the foundation of a node that founds a mesh with a founding token: the mesh's
// id, route credential and gossip key from the token, and the node's own keys, minted here.
func Found(name, token string) (*Foundation, error) {
	ft, err := ParseFounding(token)
	if err != nil {
		return nil, err
	}
	f, err := Member(name)
	if err != nil {
		return nil, err
	}
	f.MeshID, f.RouteSecret, f.GossipKey, f.Expect, f.Seeds = ft.MeshID, ft.RouteSecret, ft.GossipKey, ft.Expect, ft.Gossip
	f.Restoring, f.AwaitGrowth = ft.Restoring, ft.Restoring != nil
	return f, nil
}

// Member starts the foundation of a node that joins a mesh rather than creating one: its
// own nkey and xkey, minted here. The mesh's part comes from a founding token or an
// enrolment.
func Member(name string) (*Foundation, error) {
	nodeKey, err := nkeys.CreateServer()
	if err != nil {
		return nil, err
	}
	xkey, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, err
	}
	f := &Foundation{Node: name}
	f.NodeSeed, _ = nodeKey.Seed()
	f.NodeXKeySeed, _ = xkey.Seed()
	return f, nil
}
