package recovery_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/recovery"
)

func newKey(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

func newFoundation(t *testing.T) recovery.Foundation {
	t.Helper()
	return recovery.Foundation{RouteSecret: newKey(t), GossipKey: newKey(t), VaultSeed: []byte("SUAVAULTSEED")}
}

func TestSeal_RoundTrip(t *testing.T) {
	barrier := newKey(t)
	f := newFoundation(t)
	s, err := recovery.Seal(barrier, "mesh1", f)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range [][]byte{barrier, f.RouteSecret, f.GossipKey, f.VaultSeed} {
		if bytes.Contains(s.Box, secret) || strings.Contains(s.Check, string(secret)) {
			t.Fatalf("the sealed foundation holds a key in plaintext")
		}
	}
	got, err := recovery.Open(barrier, s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.RouteSecret, f.RouteSecret) || !bytes.Equal(got.GossipKey, f.GossipKey) || !bytes.Equal(got.VaultSeed, f.VaultSeed) {
		t.Fatalf("Open()=%+v, want %+v", got, f)
	}
}

func TestOpen_WrongKey(t *testing.T) {
	barrier := newKey(t)
	s, err := recovery.Seal(barrier, "mesh1", newFoundation(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := recovery.Open(newKey(t), s); !errors.Is(err, recovery.ErrWrongKey) {
		t.Fatalf("Open(another key) err=%v, want ErrWrongKey", err)
	}
}

func TestOpen_Damaged(t *testing.T) {
	barrier := newKey(t)
	s, err := recovery.Seal(barrier, "mesh1", newFoundation(t))
	if err != nil {
		t.Fatal(err)
	}
	box := s.Box
	s.Box = bytes.Clone(box)
	s.Box[len(s.Box)/2] ^= 1
	if _, err := recovery.Open(barrier, s); !errors.Is(err, recovery.ErrDamaged) {
		t.Fatalf("Open(a changed box) err=%v, want ErrDamaged", err)
	}
	// Moved to another mesh's manifest: the mesh id is the box's additional data.
	s.Box, s.MeshID = box, "mesh2"
	if _, err := recovery.Open(barrier, s); !errors.Is(err, recovery.ErrDamaged) {
		t.Fatalf("Open(another mesh's id) err=%v, want ErrDamaged", err)
	}
}

func TestParseKey(t *testing.T) {
	barrier := newKey(t)
	key := recovery.EncodeKey(barrier)
	if !strings.HasPrefix(key, recovery.KeyPrefix) {
		t.Fatalf("EncodeKey()=%q, want the prefix %s", key, recovery.KeyPrefix)
	}
	for _, s := range []string{key, strings.ToLower(key) + "\n", "  " + strings.ReplaceAll(key, "-", " - ")} {
		got, err := recovery.ParseKey(s)
		if err != nil || !bytes.Equal(got, barrier) {
			t.Fatalf("ParseKey(%q)=%x, %v; want the barrier key", s, got, err)
		}
	}
	// One character changed, one dropped, the prefix missing: each is a typo.
	i := len(recovery.KeyPrefix) + 5
	swap := byte('A')
	if key[i] == 'A' {
		swap = 'B'
	}
	typos := []string{key[:i] + string(swap) + key[i+1:], key[:i] + key[i+1:], strings.TrimPrefix(key, recovery.KeyPrefix), ""}
	for _, s := range typos {
		if _, err := recovery.ParseKey(s); !errors.Is(err, recovery.ErrKeyTypo) {
			t.Fatalf("ParseKey(%q) err=%v, want ErrKeyTypo", s, err)
		}
	}
}
