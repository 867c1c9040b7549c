package vault

import (
	"crypto/rand"
	"fmt"

	"github.com/meshnode/meshnode/internal/boundedmap"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/nacl/box"
)

// MintUser makes a new bus identity: an nkey user key pair. Every identity that is not the
// bus's own foundation (a module, the operator) is minted here.
func MintUser() (nkeys.KeyPair, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("mint identity: %w", err)
	}
	return kp, nil
}

// Seal encrypts data so that only the holder of the xkey recipient (an X25519 public key,
// "X…") can open it. It returns the sealed bytes and the sender key the recipient needs to
// open them. The bytes are nkeys' xkey format ("xkv1", nonce, XSalsa20-Poly1305 box), so any
// nkeys library opens them.
//
// The sender key is made once per recipient and kept in memory only, with the key the two
// agree on (an X25519 agreement, most of a fetch's cost): a client's next fetch with the
// same xkey costs no agreement on either side. A client's xkey lives as long as its
// connection; the vault forgets senders past 4,096 recipients.
func Seal(recipient string, data []byte) (sealed []byte, sender string, err error) {
	k, err := sealerFor(recipient)
	if err != nil {
		return nil, "", err
	}
	var nonce [24]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, "", fmt.Errorf("seal: %w", err)
	}
	out := make([]byte, 0, len(nkeys.XKeyVersionV1)+len(nonce)+len(data)+box.Overhead)
	out = append(append(out, nkeys.XKeyVersionV1...), nonce[:]...)
	return box.SealAfterPrecomputation(out, data, &nonce, &k.shared), k.sender, nil
}

// Opener opens what was sealed to its xkey: an nkeys xkey pair is one, and so is a
// CachingOpener.
type Opener interface {
	Open(sealed []byte, sender string) ([]byte, error)
}

// Unseal decrypts what Seal sealed for o, given the sender key Seal returned.
func Unseal(o Opener, sender string, sealed []byte) ([]byte, error) {
	data, err := o.Open(sealed, sender)
	if err != nil {
		return nil, fmt.Errorf("open sealed reply: %w", err)
	}
	return data, nil
}

// CachingOpener is an Opener for a long-lived xkey (an sdk client's): it keeps the key it
// agrees on with each sender, so a second reply from the same vault costs no X25519
// agreement. It holds the xkey for as long as it lives; a one-time xkey needs none.
type CachingOpener struct {
	kp     nkeys.KeyPair
	shared *boundedmap.Map[string, [32]byte] // by sender: a client's vaults, one per server that held the seat
}

// NewCachingOpener returns a CachingOpener for kp, an xkey pair.
func NewCachingOpener(kp nkeys.KeyPair) *CachingOpener {
	return &CachingOpener{kp: kp, shared: boundedmap.New[string, [32]byte](64)}
}

// Open opens sealed, from sender, in nkeys' xkey format.
func (o *CachingOpener) Open(sealed []byte, sender string) ([]byte, error) {
	shared, ok := o.shared.Get(sender)
	if !ok {
		var err error
		if shared, err = agree(o.kp, sender); err != nil {
			return nil, err
		}
		o.shared.Put(sender, shared)
	}
	head := len(nkeys.XKeyVersionV1) + 24
	if len(sealed) <= head || string(sealed[:len(nkeys.XKeyVersionV1)]) != nkeys.XKeyVersionV1 {
		return nil, nkeys.ErrInvalidEncrypted
	}
	var nonce [24]byte
	copy(nonce[:], sealed[len(nkeys.XKeyVersionV1):head])
	data, ok := box.OpenAfterPrecomputation(nil, sealed[head:], &nonce, &shared)
	if !ok {
		return nil, nkeys.ErrCouldNotDecrypt
	}
	return data, nil
}

// sealKey is the vault's side of one recipient: its sender key and the key they agree on.
type sealKey struct {
	sender string
	shared [32]byte
}

// sealers are the vault's sender keys, by recipient xkey; past 4,096 they start again (a
// flood of requests with new xkeys costs agreements, never memory).
var sealers = boundedmap.New[string, *sealKey](4096)

func sealerFor(recipient string) (*sealKey, error) {
	if k, ok := sealers.Get(recipient); ok {
		return k, nil
	}
	if !nkeys.IsValidPublicCurveKey(recipient) { // before a key is made for it
		return nil, fmt.Errorf("seal: %q is not an xkey public key", recipient)
	}
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	defer kp.Wipe()
	k := &sealKey{}
	if k.sender, err = kp.PublicKey(); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	if k.shared, err = agree(kp, recipient); err != nil {
		return nil, fmt.Errorf("seal: %q is not an xkey public key: %w", recipient, err)
	}
	sealers.Put(recipient, k)
	return k, nil
}

// agree is the key kp and the xkey peer agree on (X25519, as nacl/box precomputes it).
func agree(kp nkeys.KeyPair, peer string) (shared [32]byte, err error) {
	raw, err := nkeys.Decode(nkeys.PrefixByteCurve, []byte(peer))
	if err != nil || len(raw) != 32 {
		return shared, nkeys.ErrInvalidCurveKey
	}
	priv, err := curveSeed(kp)
	if err != nil {
		return shared, err
	}
	var pub [32]byte
	copy(pub[:], raw)
	box.Precompute(&shared, &pub, &priv)
	clear(priv[:])
	return shared, nil
}

// curveSeed is the raw X25519 private key of an xkey pair.
func curveSeed(kp nkeys.KeyPair) ([32]byte, error) {
	var priv [32]byte
	seed, err := kp.Seed()
	if err != nil {
		return priv, err
	}
	defer clear(seed)
	prefix, raw, err := nkeys.DecodeSeed(seed)
	if err != nil || prefix != nkeys.PrefixByteCurve || len(raw) != 32 {
		return priv, nkeys.ErrInvalidCurveKey
	}
	copy(priv[:], raw)
	clear(raw)
	return priv, nil
}
