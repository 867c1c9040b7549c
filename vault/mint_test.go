package vault_test

import (
	"bytes"
	"testing"

	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nkeys"
)

func TestSealOpen(t *testing.T) {
	recipient, _ := nkeys.CreateCurveKeys()
	pub, _ := recipient.PublicKey()
	secret := []byte("SUAEXAMPLESEED")
	sealed, sender, err := vault.Seal(pub, secret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, secret) {
		t.Fatal("sealed bytes contain the plaintext")
	}
	got, err := vault.Unseal(recipient, sender, sealed)
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("Open=%q, %v; want %q", got, err, secret)
	}
	other, _ := nkeys.CreateCurveKeys()
	if _, err := vault.Unseal(other, sender, sealed); err == nil {
		t.Fatal("another xkey opened the sealed bytes")
	}
	if _, _, err := vault.Seal("UABC", secret); err == nil {
		t.Fatal("Seal accepted a non-xkey recipient")
	}
}

func TestMintUser(t *testing.T) {
	a, err := vault.MintUser()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := vault.MintUser()
	pa, _ := a.PublicKey()
	pb, _ := b.PublicKey()
	if !nkeys.IsValidPublicUserKey(pa) || pa == pb {
		t.Fatalf("minted %s and %s", pa, pb)
	}
}
