package genesis_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/genesis"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

func openDB(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "meshnode.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestGenesis_Begin(t *testing.T) {
	g := genesis.New(openDB(t))
	if _, err := g.Begin("alpha", 2); !errors.Is(err, genesis.ErrTwoServers) {
		t.Fatalf("expect 2: %v, want ErrTwoServers", err)
	}
	if _, err := g.Record(); !errors.Is(err, genesis.ErrNone) {
		t.Fatalf("a refused genesis left a record: %v", err)
	}
	f, err := g.Begin("alpha", 1)
	if err != nil {
		t.Fatal(err)
	}
	for what, v := range map[string][]byte{"route": f.RouteSecret, "gossip": f.GossipKey, "barrier": f.BarrierKey} {
		if len(v) != 32 {
			t.Errorf("%s key is %d bytes, want 32", what, len(v))
		}
	}
	r, err := g.Record()
	if err != nil {
		t.Fatal(err)
	}
	// Exactly the foundation, recorded by fingerprint, never by value.
	want := []string{"mesh id", "node nkey", "node xkey", "route credential", "gossip key", "barrier key", "vault identity"}
	if len(r.Minted) != len(want) {
		t.Fatalf("minted %v, want %v", r.Minted, want)
	}
	rec, _ := json.Marshal(r)
	for i, m := range r.Minted {
		if m.What != want[i] {
			t.Errorf("minted[%d]=%q, want %q", i, m.What, want[i])
		}
	}
	for _, secret := range [][]byte{f.RouteSecret, f.GossipKey, f.BarrierKey, f.NodeSeed, f.VaultSeed, f.NodeXKeySeed} {
		if bytes.Contains(rec, secret) {
			t.Fatal("the genesis record holds a secret value")
		}
	}

	if _, err := g.Begin("alpha", 1); !errors.Is(err, genesis.ErrExists) {
		t.Fatalf("second genesis: %v, want ErrExists", err)
	}
	if err := g.HandOff(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Begin("alpha", 1); !errors.Is(err, genesis.ErrHandedOff) {
		t.Fatalf("genesis after hand-off: %v, want ErrHandedOff", err)
	}
	if _, err := g.Begin("beta", 3); !errors.Is(err, genesis.ErrHandedOff) {
		t.Fatalf("genesis after hand-off, another name: %v, want ErrHandedOff", err)
	}
}

func TestFoundingToken(t *testing.T) {
	g := genesis.New(openDB(t))
	f, err := g.Begin("alpha", 3)
	if err != nil {
		t.Fatal(err)
	}
	tok := f.FoundingToken(3, []string{"10.0.0.1:7946"})
	got, err := genesis.ParseFounding(tok)
	if err != nil {
		t.Fatal(err)
	}
	if got.MeshID != f.MeshID || got.Expect != 3 || !bytes.Equal(got.GossipKey, f.GossipKey) || !bytes.Equal(got.RouteSecret, f.RouteSecret) {
		t.Fatalf("founding token round trip: %+v", got)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(tok, genesis.FoundingPrefix))
	if strings.Contains(string(raw), base64.StdEncoding.EncodeToString(f.BarrierKey)) || strings.Contains(string(raw), string(f.VaultSeed)) {
		t.Fatal("the founding token carries the vault's own credentials")
	}
	if _, err := genesis.ParseFounding("MNF1.@@@"); err == nil {
		t.Fatal("a damaged founding token parsed")
	}
}

// TestGenesis_Restore: a restored foundation keeps the snapshot's mesh and keys with new
// node keys, is marked restoring, is recorded handed off (no operator is minted), refuses a
// used store, and its founding token makes the founding nodes wait for the restore.
func TestGenesis_Restore(t *testing.T) {
	vault, _ := nkeys.CreateUser()
	vaultSeed, _ := vault.Seed()
	from := genesis.Restored{MeshID: "m1", RouteSecret: bytes.Repeat([]byte{1}, 32), GossipKey: bytes.Repeat([]byte{2}, 32),
		BarrierKey: bytes.Repeat([]byte{3}, 32), VaultSeed: vaultSeed, From: genesis.Restoring{File: "/b/mesh.snap", SHA256: "ab12"}}
	g := genesis.New(openDB(t))
	f, err := g.Restore("alpha", 3, from)
	if err != nil {
		t.Fatal(err)
	}
	if f.MeshID != "m1" || !bytes.Equal(f.RouteSecret, from.RouteSecret) || !bytes.Equal(f.GossipKey, from.GossipKey) ||
		!bytes.Equal(f.BarrierKey, from.BarrierKey) || !bytes.Equal(f.VaultSeed, vaultSeed) || f.Restoring == nil || *f.Restoring != from.From {
		t.Fatalf("restored foundation %+v lacks the snapshot's", f)
	}
	if _, err := f.NodeKey(); err != nil || len(f.NodeXKeySeed) == 0 {
		t.Fatalf("the node's keys: %v", err)
	}
	r, err := g.Record()
	if err != nil || r.HandedOff.IsZero() || r.Restored == nil || r.MeshID != "m1" {
		t.Fatalf("record %+v, %v: want it handed off and naming the snapshot", r, err)
	}
	if _, err := g.Restore("alpha", 3, from); !errors.Is(err, genesis.ErrExists) {
		t.Fatalf("Restore over a mesh: %v, want ErrExists", err)
	}
	founder, err := genesis.Found("beta", f.FoundingToken(3, []string{"127.0.0.1:7946"}))
	if err != nil || !founder.AwaitGrowth || founder.MeshID != "m1" || founder.Restoring == nil || founder.Restoring.SHA256 != "ab12" || founder.Restoring.File != "" {
		t.Fatalf("a founder of the restored mesh: %+v, %v; want it waiting for the restore", founder, err)
	}
	plain, err := genesis.New(openDB(t)).Begin("gamma", 3)
	if err != nil {
		t.Fatal(err)
	}
	if founder, err := genesis.Found("delta", plain.FoundingToken(3, nil)); err != nil || founder.AwaitGrowth {
		t.Fatalf("a founder of a new mesh: %+v, %v; want it not waiting", founder, err)
	}
}
