package vault

import (
	"fmt"

	"github.com/nats-io/nkeys"
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
// "X…") can open it. It returns the sealed bytes and the one-time sender key the recipient
// needs to open them.
func Seal(recipient string, data []byte) (sealed []byte, sender string, err error) {
	if !nkeys.IsValidPublicCurveKey(recipient) {
		return nil, "", fmt.Errorf("seal: %q is not an xkey public key", recipient)
	}
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, "", fmt.Errorf("seal: %w", err)
	}
	defer kp.Wipe()
	sealed, err = kp.Seal(data, recipient)
	if err != nil {
		return nil, "", fmt.Errorf("seal: %w", err)
	}
	sender, err = kp.PublicKey()
	return sealed, sender, err
}

// Unseal decrypts what Seal sealed for kp, given the sender key Seal returned.
func Unseal(kp nkeys.KeyPair, sender string, sealed []byte) ([]byte, error) {
	data, err := kp.Open(sealed, sender)
	if err != nil {
		return nil, fmt.Errorf("open sealed reply: %w", err)
	}
	return data, nil
}
