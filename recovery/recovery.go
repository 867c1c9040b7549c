package recovery

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/meshnode/meshnode/api"
)

// Errors of opening a sealed foundation or reading a recovery key.
var (
	// ErrWrongKey means the recovery key is a valid one, but not this mesh's: its key-check
	// value differs from the one sealed with the foundation.
	ErrWrongKey = errors.New("the recovery key is not the one this snapshot's foundation was sealed under")
	// ErrDamaged means the key is right but the sealed foundation does not open: its bytes
	// changed.
	ErrDamaged = errors.New("the sealed foundation is damaged")
	// ErrKeyTypo means a recovery key does not read: mistyped, cut short, or not one.
	ErrKeyTypo = errors.New("not a recovery key")
)

// The sealed foundation's format.
const (
	// SealVersion is the version of the sealing Seal writes and Open reads.
	SealVersion = 1
	// sealInfo is HKDF's info: the key it derives seals foundations and nothing else.
	sealInfo = "meshnode snapshot foundation v1"
	// KeyPrefix starts every recovery key, with its version.
	KeyPrefix = "MNRK1-"
	keySize   = 32 // the barrier key: AES-256
	sumSize   = 4  // the recovery key's checksum: the first bytes of its SHA-256
	groupSize = 4  // characters between the dashes of a printed recovery key
)

// Foundation is what a snapshot needs, besides its streams, to restore its mesh whole: the
// route secret (the mesh's CA derives from it, so ca.pem stays valid), the gossip key, and
// the vault's own bus identity (the registry names its public key). The barrier key is the
// recovery key itself, kept by the operator.
type Foundation struct {
	RouteSecret []byte `json:"route_secret"`
	GossipKey   []byte `json:"gossip_key"`
	VaultSeed   []byte `json:"vault_seed"`
}

// derive returns the sealing key and the key-check value of barrier: both from one HKDF
// read, so the check tells nothing of the sealing key, and a wrong barrier key is told
// apart from a damaged box.
func derive(barrier []byte) (key []byte, check string, err error) {
	if len(barrier) != keySize {
		return nil, "", fmt.Errorf("a barrier key is %d bytes, not %d", keySize, len(barrier))
	}
	out, err := hkdf.Key(sha256.New, barrier, nil, sealInfo, keySize+16)
	if err != nil {
		return nil, "", err
	}
	return out[:keySize], hex.EncodeToString(out[keySize:]), nil
}

// Seal seals f under barrier for mesh meshID (bound to the box, so a foundation cannot be
// moved to another mesh's manifest).
func Seal(barrier []byte, meshID string, f Foundation) (*api.SealedFoundation, error) {
	key, check, err := derive(barrier)
	if err != nil {
		return nil, err
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	plain, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	return &api.SealedFoundation{
		Version: SealVersion, MeshID: meshID, Check: check, Nonce: nonce,
		Box: aead.Seal(nil, nonce, plain, []byte(meshID)),
	}, nil
}

// Open opens s with barrier: ErrWrongKey when barrier is not the key it was sealed under,
// ErrDamaged when it is but the box does not open.
func Open(barrier []byte, s *api.SealedFoundation) (Foundation, error) {
	if s.Version != SealVersion {
		return Foundation{}, fmt.Errorf("the sealed foundation is of version %d; this meshnode reads version %d: use the meshnode that saved the snapshot, or a newer one", s.Version, SealVersion)
	}
	key, check, err := derive(barrier)
	if err != nil {
		return Foundation{}, err
	}
	if subtle.ConstantTimeCompare([]byte(check), []byte(s.Check)) != 1 {
		return Foundation{}, fmt.Errorf("%w (mesh %s): use the recovery key `meshnode vault recovery-key` printed for this mesh", ErrWrongKey, s.MeshID)
	}
	aead, err := newAEAD(key)
	if err != nil {
		return Foundation{}, err
	}
	if len(s.Nonce) != aead.NonceSize() {
		return Foundation{}, fmt.Errorf("%w: its nonce is %d bytes, not %d; use another copy of the snapshot", ErrDamaged, len(s.Nonce), aead.NonceSize())
	}
	plain, err := aead.Open(nil, s.Nonce, s.Box, []byte(s.MeshID))
	if err != nil {
		return Foundation{}, fmt.Errorf("%w: it does not open under the right key (%v); use another copy of the snapshot", ErrDamaged, err)
	}
	var f Foundation
	if err := json.Unmarshal(plain, &f); err != nil || len(f.RouteSecret) == 0 || len(f.GossipKey) == 0 || len(f.VaultSeed) == 0 {
		return Foundation{}, fmt.Errorf("%w: it opens to no whole foundation; use another copy of the snapshot", ErrDamaged)
	}
	return f, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// encoding is the recovery key's alphabet: base32 (no 0/1/8 to mistake), upper case, no
// padding.
var encoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// EncodeKey prints barrier as a recovery key: KeyPrefix, then the key and a checksum in
// base32, in dash-separated groups.
func EncodeKey(barrier []byte) string {
	sum := sha256.Sum256(barrier)
	raw := encoding.EncodeToString(append(append([]byte{}, barrier...), sum[:sumSize]...))
	var groups []string
	for len(raw) > groupSize {
		groups = append(groups, raw[:groupSize])
		raw = raw[groupSize:]
	}
	return KeyPrefix + strings.Join(append(groups, raw), "-")
}

// ParseKey reads a recovery key (case, spaces and line breaks aside) back into the barrier
// key; ErrKeyTypo when it does not read or its checksum differs.
func ParseKey(s string) ([]byte, error) {
	s = strings.ToUpper(strings.Join(strings.Fields(s), ""))
	raw, ok := strings.CutPrefix(s, KeyPrefix)
	if !ok {
		return nil, fmt.Errorf("%w: it does not start with %s (`meshnode vault recovery-key` prints one)", ErrKeyTypo, KeyPrefix)
	}
	b, err := encoding.DecodeString(strings.ReplaceAll(raw, "-", ""))
	if err != nil || len(b) != keySize+sumSize {
		return nil, fmt.Errorf("%w: it is mistyped or cut short (it holds %d base32 characters after %s); copy it again whole", ErrKeyTypo, len(strings.ReplaceAll(raw, "-", "")), KeyPrefix)
	}
	key, sum := b[:keySize], sha256.Sum256(b[:keySize])
	if subtle.ConstantTimeCompare(sum[:sumSize], b[keySize:]) != 1 {
		return nil, fmt.Errorf("%w: its checksum differs, so a character is mistyped; copy it again", ErrKeyTypo)
	}
	return key, nil
}
