package vault

import (
	"errors"
	"testing"

	"github.com/nats-io/nkeys"
)

// TestSeal_IsNkeysFormat: what Seal seals opens with nkeys' own Open (what a module in
// another language uses) and with a CachingOpener, and what nkeys seals opens with both; a
// second seal to the same recipient reuses its sender (no new key agreement), another
// recipient gets another; a reply sealed to someone else, or altered, does not open.
func TestSeal_IsNkeysFormat(t *testing.T) {
	client, _ := nkeys.CreateCurveKeys()
	clientPub, _ := client.PublicKey()
	other, _ := nkeys.CreateCurveKeys()
	otherPub, _ := other.PublicKey()

	sealed, sender, err := Seal(clientPub, []byte("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := client.Open(sealed, sender); err != nil || string(got) != "s3cret" {
		t.Fatalf("nkeys opens Seal's output: %q %v", got, err)
	}
	caching := NewCachingOpener(client)
	for range 2 { // the second from the kept key
		if got, err := Unseal(caching, sender, sealed); err != nil || string(got) != "s3cret" {
			t.Fatalf("Unseal with a CachingOpener: %q %v", got, err)
		}
	}
	again, sender2, err := Seal(clientPub, []byte("s3cret"))
	if err != nil || sender2 != sender || string(again) == string(sealed) {
		t.Fatalf("a second seal to the same recipient: sender %s (was %s), same bytes %v, %v", sender2, sender, string(again) == string(sealed), err)
	}
	if _, sender3, _ := Seal(otherPub, []byte("x")); sender3 == sender {
		t.Fatal("two recipients share a sender key")
	}
	if _, err := Unseal(NewCachingOpener(other), sender, sealed); err == nil {
		t.Fatal("a reply sealed to another xkey opened")
	}
	altered := append([]byte(nil), sealed...)
	altered[len(altered)-1] ^= 1
	if _, err := Unseal(caching, sender, altered); !errors.Is(err, nkeys.ErrCouldNotDecrypt) {
		t.Fatalf("an altered reply: %v", err)
	}
	// What nkeys seals (a sender of its own), Unseal opens.
	nk, _ := nkeys.CreateCurveKeys()
	nkPub, _ := nk.PublicKey()
	b, err := nk.Seal([]byte("from nkeys"), clientPub)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []Opener{client, caching} {
		if got, err := Unseal(o, nkPub, b); err != nil || string(got) != "from nkeys" {
			t.Fatalf("Unseal of nkeys' seal: %q %v", got, err)
		}
	}
	if _, _, err := Seal("not-an-xkey", []byte("x")); err == nil {
		t.Fatal("sealed to a malformed key")
	}
}
