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

// Unseal decrypts what Seal sealed for kp, given the sender key Seal returned. The key kp
// and the sender agree on is kept for the next reply from the same sender.
func Unseal(kp nkeys.KeyPair, sender string, sealed []byte) ([]byte, error) {
	shared, err := openers.get(kp, sender)
	if err != nil {
		return nil, fmt.Errorf("open sealed reply: %w", err)
	}
	head := len(nkeys.XKeyVersionV1) + 24
	if len(sealed) <= head || string(sealed[:len(nkeys.XKeyVersionV1)]) != nkeys.XKeyVersionV1 {
		return nil, fmt.Errorf("open sealed reply: %w", nkeys.ErrInvalidEncrypted)
	}
	var nonce [24]byte
	copy(nonce[:], sealed[len(nkeys.XKeyVersionV1):head])
	data, ok := box.OpenAfterPrecomputation(nil, sealed[head:], &nonce, &shared)
	if !ok {
		return nil, fmt.Errorf("open sealed reply: %w", nkeys.ErrCouldNotDecrypt)
	}
	return data, nil
}

// sealersMost and openersMost bound the keys kept; past them, all are forgotten at once
// (a flood of requests with new xkeys costs agreements, never memory).
const (
	sealersMost = 4096
	openersMost = 1024
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

type openKey struct {
	kp     nkeys.KeyPair
	sender string
}

var openers = openCache{m: map[openKey][32]byte{}}

type openCache struct {
	mu sync.Mutex
	m  map[openKey][32]byte
}

func (c *openCache) get(kp nkeys.KeyPair, sender string) ([32]byte, error) {
	key := openKey{kp, sender}
	c.mu.Lock()
	shared, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return shared, nil
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteCurve, []byte(sender))
	if err != nil || len(raw) != 32 {
		return shared, nkeys.ErrInvalidSender
	}
	priv, err := curveSeed(kp)
	if err != nil {
		return shared, err
	}
	var spub [32]byte
	copy(spub[:], raw)
	box.Precompute(&shared, &spub, &priv)
	clear(priv[:])
	c.mu.Lock()
	if len(c.m) >= openersMost {
		clear(c.m)
	}
	c.m[key] = shared
	c.mu.Unlock()
	return shared, nil
}

// curveSeed is the raw X25519 private key of an xkey pair.
func curveSeed(kp nkeys.KeyPair) ([32]byte, error) {
	var priv [32]byte
	seed, err := kp.Seed()
	if err != nil {
		return priv, err
	}
	prefix, raw, err := nkeys.DecodeSeed(seed)
	if err != nil || prefix != nkeys.PrefixByteCurve || len(raw) != 32 {
		return priv, nkeys.ErrInvalidCurveKey
	}
	copy(priv[:], raw)
	return priv, nil
}
