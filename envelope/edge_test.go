package envelope

import (
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"github.com/nats-io/nkeys"
	"github.com/oasisprotocol/curve25519-voi/curve"
)

// edgeVector is one entry of testdata/ed25519-edge.json: a signature at the edge of what
// Ed25519 verifiers disagree on, and the mesh rule's verdict (valid) beside crypto/ed25519's.
type edgeVector struct {
	Name      string `json:"name"`
	Message   string `json:"message"`
	PublicKey string `json:"public_key"`
	Signature string `json:"signature"`
	Valid     bool   `json:"valid"`
	Stdlib    bool   `json:"stdlib"`
}

func edgeVectors(t *testing.T) []edgeVector {
	t.Helper()
	b, err := os.ReadFile("testdata/ed25519-edge.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []edgeVector
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	return vs
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEd25519_EdgeVectors: the mesh's rule (Rule) gives each edge case its listed verdict,
// one at a time and in a batch (alone, and among honest signatures), through the path
// Verify and VerifyBatch take (the key as an nkey, expanded); crypto/ed25519 gives its own
// listed verdict, so the file says exactly where the two rules part.
func TestEd25519_EdgeVectors(t *testing.T) {
	vs := edgeVectors(t)
	honest := vs[0]
	item := func(v edgeVector) (signedInput, bool) {
		nk, err := nkeys.Encode(nkeys.PrefixByteUser, unhex(t, v.PublicKey))
		if err != nil {
			t.Fatal(err)
		}
		pub, err := expanded(string(nk))
		if err != nil {
			return signedInput{}, false // not a point: nothing verifies against it
		}
		return signedInput{pub, unhex(t, v.Message), unhex(t, v.Signature)}, true
	}
	h, _ := item(honest)
	for _, v := range vs {
		if got := ed25519.Verify(unhex(t, v.PublicKey), unhex(t, v.Message), unhex(t, v.Signature)); got != v.Stdlib {
			t.Errorf("%s: crypto/ed25519 says %v, the file %v", v.Name, got, v.Stdlib)
		}
		it, ok := item(v)
		if !ok {
			if v.Valid {
				t.Errorf("%s: its key does not expand, and the file says valid", v.Name)
			}
			continue
		}
		if got := verifyAll([]signedInput{it})[0]; got != v.Valid {
			t.Errorf("%s: the rule says %v alone, the file %v", v.Name, got, v.Valid)
		}
		batch := []signedInput{h, h, it, h, h, h, h, h}
		got := verifyAll(batch)
		for i, ok := range got {
			want := i != 2 || v.Valid
			if ok != want {
				t.Errorf("%s: in a batch of 8, entry %d is %v, want %v", v.Name, i, ok, want)
			}
		}
	}
}

// TestEd25519_CraftedRIsCrafted: the crafted vector is what its name says — an honest key
// of prime order, and an R with a small-order part (neither of prime order nor of small
// order) — so it tests the cofactored equation and nothing else.
func TestEd25519_CraftedRIsCrafted(t *testing.T) {
	v := edgeVectors(t)[2]
	point := func(b []byte) *curve.EdwardsPoint {
		var c curve.CompressedEdwardsY
		if _, err := c.SetBytes(b); err != nil {
			t.Fatal(err)
		}
		var p curve.EdwardsPoint
		if _, err := p.SetCompressedY(&c); err != nil {
			t.Fatal(err)
		}
		return &p
	}
	a, r := point(unhex(t, v.PublicKey)), point(unhex(t, v.Signature)[:32])
	if !a.IsTorsionFree() || a.IsSmallOrder() {
		t.Fatal("the crafted vector's key is not of prime order")
	}
	if r.IsTorsionFree() || r.IsSmallOrder() {
		t.Fatal("the crafted vector's R has no small-order part, or nothing else")
	}
	if !v.Valid || v.Stdlib {
		t.Fatalf("the crafted vector: valid %v, stdlib %v; want true, false", v.Valid, v.Stdlib)
	}
}
