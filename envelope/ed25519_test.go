package envelope_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/meshnode/meshnode/envelope"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// TestEd25519_AsTheStandardLibrary: the signing key signs exactly as crypto/ed25519 (and
// nkeys) does, and Verify accepts what crypto/ed25519 accepts over valid signatures,
// signatures with a flipped bit anywhere, altered inputs, another key, and keys of every nkey
// type the mesh verifies with (user, server, operator). The two rules part only on crafted
// signatures (TestEd25519_EdgeVectors).
func TestEd25519_AsTheStandardLibrary(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, create := range []func() (nkeys.KeyPair, error){nkeys.CreateUser, nkeys.CreateServer, nkeys.CreateOperator} {
		kp, _ := create()
		pub, _ := kp.PublicKey()
		other, _ := nkeys.CreateUser()
		otherPub, _ := other.PublicKey()
		seed, _ := kp.Seed()
		_, raw, _ := nkeys.DecodeSeed(seed)
		priv := ed25519.NewKeyFromSeed(raw)
		k, err := envelope.NewSigningKey(kp)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			h := nats.Header{}
			h.Set(envelope.EventID, "01936b2e-1f00-7000-8000-000000000001")
			h.Set(envelope.Time, "2026-12-02T00:00:00Z")
			h.Set(envelope.Source, "a")
			body := make([]byte, rng.IntN(300))
			for j := range body {
				body[j] = byte(rng.UintN(256))
			}
			subject := "mesh.mod.a.event.x"
			input := envelope.SigningInput(h.Get(envelope.EventID), h.Get(envelope.Time), subject, "a", body)
			sig, _ := k.Sign(input)
			if want := ed25519.Sign(priv, input); string(sig) != string(want) {
				t.Fatalf("key %s: the signature differs from crypto/ed25519's", pub[:1])
			}
			if i%3 == 1 { // a flipped bit
				sig[rng.IntN(len(sig))] ^= 1 << rng.UintN(8)
			}
			if i%3 == 2 && len(body) > 0 { // an altered body
				body[0] ^= 1
			}
			h.Set(envelope.Signature, base64.RawURLEncoding.EncodeToString(sig))
			want := ed25519.Verify(priv.Public().(ed25519.PublicKey), envelope.SigningInput(h.Get(envelope.EventID), h.Get(envelope.Time), subject, "a", body), sig)
			got := envelope.Verify(h, subject, body, pub)
			if (got == nil) != want {
				t.Fatalf("key %s, case %d: Verify says %v, crypto/ed25519 %v", pub[:1], i, got, want)
			}
			if got != nil && !errors.Is(got, envelope.ErrBadSignature) {
				t.Fatalf("a bad signature: %v, want ErrBadSignature", got)
			}
			if want && envelope.Verify(h, subject, body, otherPub) == nil {
				t.Fatal("another key verifies the signature")
			}
		}
	}
	if err := envelope.Verify(nats.Header{envelope.Signature: {"AAAA"}}, "s", nil, "not-a-key"); err == nil {
		t.Fatal("a malformed key verifies")
	}
}

// TestSigningKey_PublicKey: the expanded key's public key is the nkey's, for each kind.
func TestSigningKey_PublicKey(t *testing.T) {
	for _, create := range []func() (nkeys.KeyPair, error){nkeys.CreateUser, nkeys.CreateServer, nkeys.CreateOperator} {
		kp, _ := create()
		want, _ := kp.PublicKey()
		k, err := envelope.NewSigningKey(kp)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := k.PublicKey(); err != nil || got != want {
			t.Fatalf("PublicKey %s %v, want %s", got, err, want)
		}
	}
}
