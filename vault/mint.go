package vault

import (
	"crypto/rand"
	"fmt"
	"sync"

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
// connection; the vault forgets senders past sealersMost recipients.
func Seal(recipient string, data []byte) (sealed []byte, sender string, err error) {
	k, err := sealers.get(recipient)
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
	mu     sync.Mutex
	shared map[string][32]byte // by sender
}

// NewCachingOpener returns a CachingOpener for kp, an xkey pair.
func NewCachingOpener(kp nkeys.KeyPair) *CachingOpener {
	return &CachingOpener{kp: kp, shared: map[string][32]byte{}}
}

// Open opens sealed, from sender, in nkeys' xkey format.
func (o *CachingOpener) Open(sealed []byte, sender string) ([]byte, error) {
	shared, err := o.agreed(sender)
	if err != nil {
		return nil, err
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

func (o *CachingOpener) agreed(sender string) ([32]byte, error) {
	o.mu.Lock()
	shared, ok := o.shared[sender]
	o.mu.Unlock()
	if ok {
		return shared, nil
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteCurve, []byte(sender))
	if err != nil || len(raw) != 32 {
		return shared, nkeys.ErrInvalidSender
	}
	priv, err := curveSeed(o.kp)
	if err != nil {
		return shared, err
	}
	var spub [32]byte
	copy(spub[:], raw)
	box.Precompute(&shared, &spub, &priv)
	clear(priv[:])
	o.mu.Lock()
	if len(o.shared) >= openersMost {
		clear(o.shared)
	}
	o.shared[sender] = shared
	o.mu.Unlock()
	return shared, nil
}

// sealersMost and openersMost bound the keys kept; past them, all are forgotten at once
// (a flood of requests with new xkeys costs agreements, never memory).
const (
	sealersMost = 4096
	openersMost = 64 // a client's vaults: one per server that held the seat
)

type sealKey struct {
	sender string
	shared [32]byte
}

var sealers = sealCache{m: map[string]*sealKey{}}

type sealCache struct {
	mu sync.Mutex
	m  map[string]*sealKey
}

func (c *sealCache) get(recipient string) (*sealKey, error) {
	c.mu.Lock()
	k := c.m[recipient]
	c.mu.Unlock()
	if k != nil {
		return k, nil
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteCurve, []byte(recipient))
	if err != nil || len(raw) != 32 {
		return nil, fmt.Errorf("seal: %q is not an xkey public key", recipient)
	}
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	defer kp.Wipe()
	priv, err := curveSeed(kp)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	k = &sealKey{}
	if k.sender, err = kp.PublicKey(); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	var rpub [32]byte
	copy(rpub[:], raw)
	box.Precompute(&k.shared, &rpub, &priv)
	clear(priv[:])
	c.mu.Lock()
	if len(c.m) >= sealersMost {
		clear(c.m)
	}
	c.m[recipient] = k
	c.mu.Unlock()
	return k, nil
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
