package vault

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// secretRecord is one secret at rest: its versions, each encrypted under the barrier key
// with the record's name and version as additional data (a ciphertext cannot be moved to
// another name).
type secretRecord struct {
	Owner    string    `json:"owner"`
	Name     string    `json:"name"`
	Versions []version `json:"versions"`
}

type version struct {
	Version int        `json:"version"`
	Created time.Time  `json:"created"`
	Until   *time.Time `json:"until,omitempty"` // a rotated-out version is readable until then
	Nonce   []byte     `json:"nonce"`
	Cipher  []byte     `json:"cipher"`
}

func secretKey(owner, name string) string { return "secret." + owner + "." + name }

func checkNames(owner, name string) error {
	if owner != CallerOperator && !manifest.ValidName(owner) {
		return fmt.Errorf("owner %q is not a module name", owner)
	}
	if !manifest.ValidName(name) {
		return fmt.Errorf("secret name %q: lower-case letters, digits and '-'", name)
	}
	return nil
}

func (v *Vault) seal(owner, name string, ver int, value string) (nonce, ct []byte, err error) {
	nonce = make([]byte, v.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, err
	}
	return nonce, v.aead.Seal(nil, nonce, []byte(value), aad(owner, name, ver)), nil
}

func (v *Vault) unseal(owner, name string, ver version) (string, error) {
	plain, err := v.aead.Open(nil, ver.Nonce, ver.Cipher, aad(owner, name, ver.Version))
	if err != nil {
		return "", fmt.Errorf("decrypt %s/%s v%d: the record does not open under this barrier key", owner, name, ver.Version)
	}
	return string(plain), nil
}

func aad(owner, name string, ver int) []byte {
	return []byte(fmt.Sprintf("%s/%s/%d", owner, name, ver))
}

func (v *Vault) load(ctx context.Context, owner, name string) (*secretRecord, uint64, error) {
	e, err := v.kv.Get(ctx, secretKey(owner, name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var r secretRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, 0, err
	}
	return &r, e.Revision(), nil
}

func (v *Vault) store(ctx context.Context, r *secretRecord, rev uint64) error {
	b, _ := json.Marshal(r)
	var err error
	if rev == 0 {
		_, err = v.kv.Create(ctx, secretKey(r.Owner, r.Name), b)
	} else {
		_, err = v.kv.Update(ctx, secretKey(r.Owner, r.Name), b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("secret %s/%s changed meanwhile; try again", r.Owner, r.Name)
	}
	return err
}

// mint creates a secret with a random value (version 1).
func (v *Vault) mint(ctx context.Context, req Request) (*Secret, error) {
	if err := checkNames(req.Owner, req.Name); err != nil {
		return nil, err
	}
	if r, _, err := v.load(ctx, req.Owner, req.Name); err != nil {
		return nil, err
	} else if r != nil {
		return nil, fmt.Errorf("secret %s of %s exists (version %d); rotate it instead", req.Name, req.Owner, r.Versions[len(r.Versions)-1].Version)
	}
	value, err := randomValue()
	if err != nil {
		return nil, err
	}
	nonce, ct, err := v.seal(req.Owner, req.Name, 1, value)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	r := &secretRecord{Owner: req.Owner, Name: req.Name, Versions: []version{{Version: 1, Created: now, Nonce: nonce, Cipher: ct}}}
	if err := v.store(ctx, r, 0); err != nil {
		return nil, err
	}
	v.event("minted", map[string]any{"owner": req.Owner, "name": req.Name, "version": 1})
	return &Secret{Meta: Meta{Owner: req.Owner, Name: req.Name, Version: 1, Versions: []int{1}, Created: now}, Value: value}, nil
}

// rotate adds a new version; the previous stays readable for the grace period.
func (v *Vault) rotate(ctx context.Context, req Request) (*Secret, error) {
	if err := checkNames(req.Owner, req.Name); err != nil {
		return nil, err
	}
	grace := DefaultGrace
	if req.Grace != "" {
		d, err := time.ParseDuration(req.Grace)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("grace %q is not a duration", req.Grace)
		}
		grace = d
	}
	r, rev, err := v.load(ctx, req.Owner, req.Name)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, fmt.Errorf("secret %s of %s does not exist; mint it first", req.Name, req.Owner)
	}
	now := time.Now().UTC()
	until := now.Add(grace)
	live := r.Versions[:0]
	for _, ver := range r.Versions {
		if ver.Until == nil {
			ver.Until = &until
		}
		if ver.Until.After(now) {
			live = append(live, ver)
		}
	}
	next := r.Versions[len(r.Versions)-1].Version + 1
	value, err := randomValue()
	if err != nil {
		return nil, err
	}
	nonce, ct, err := v.seal(req.Owner, req.Name, next, value)
	if err != nil {
		return nil, err
	}
	r.Versions = append(live, version{Version: next, Created: now, Nonce: nonce, Cipher: ct})
	if err := v.store(ctx, r, rev); err != nil {
		return nil, err
	}
	v.event("rotated", map[string]any{"owner": req.Owner, "name": req.Name, "version": next, "previous_until": until})
	return &Secret{Meta: meta(r), Value: value}, nil
}

// fetch returns the current version, or a requested one that is still readable.
func (v *Vault) fetch(ctx context.Context, req Request) (*Secret, error) {
	if err := checkNames(req.Owner, req.Name); err != nil {
		return nil, err
	}
	r, _, err := v.load(ctx, req.Owner, req.Name)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, fmt.Errorf("secret %s of %s does not exist; the operator mints it with `meshnode vault mint %s --owner %s`", req.Name, req.Owner, req.Name, req.Owner)
	}
	ver := r.Versions[len(r.Versions)-1]
	if req.Version != 0 {
		i := slices.IndexFunc(r.Versions, func(x version) bool { return x.Version == req.Version })
		if i < 0 || (r.Versions[i].Until != nil && time.Now().After(*r.Versions[i].Until)) {
			return nil, fmt.Errorf("version %d of %s/%s is not readable (readable: %v)", req.Version, req.Owner, req.Name, meta(r).Versions)
		}
		ver = r.Versions[i]
	}
	value, err := v.unseal(r.Owner, r.Name, ver)
	if err != nil {
		return nil, err
	}
	v.event("fetched", map[string]any{"owner": req.Owner, "name": req.Name, "version": ver.Version})
	m := meta(r)
	m.Version, m.Created = ver.Version, ver.Created
	return &Secret{Meta: m, Value: value}, nil
}

func meta(r *secretRecord) Meta {
	m := Meta{Owner: r.Owner, Name: r.Name}
	now := time.Now()
	for _, ver := range r.Versions {
		if ver.Until == nil || ver.Until.After(now) {
			m.Versions = append(m.Versions, ver.Version)
		}
	}
	last := r.Versions[len(r.Versions)-1]
	m.Version, m.Created = last.Version, last.Created
	return m
}

// list returns every secret's metadata (of one owner, if given).
func (v *Vault) list(ctx context.Context, owner string) ([]Meta, error) {
	filter := "secret.>"
	if owner != "" {
		filter = "secret." + owner + ".>"
	}
	lister, err := v.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, err
	}
	out := []Meta{}
	for k := range lister.Keys() {
		parts := strings.SplitN(k, ".", 3)
		if len(parts) != 3 {
			continue
		}
		r, _, err := v.load(ctx, parts[1], parts[2])
		if err != nil || r == nil {
			continue
		}
		out = append(out, meta(r))
	}
	return out, nil
}

// identity mints an nkey identity for owner (a module at registration, the operator at
// handoff) and records its public key; the seed exists only in the sealed reply.
func (v *Vault) identity(ctx context.Context, req Request) (*Identity, error) {
	if req.Owner != CallerOperator && !manifest.ValidName(req.Owner) {
		return nil, fmt.Errorf("owner %q is not a module name", req.Owner)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	rec, _ := json.Marshal(map[string]any{"owner": req.Owner, "public_key": pub, "created": time.Now().UTC()})
	if _, err := v.kv.Put(ctx, "identity."+req.Owner+"."+pub, rec); err != nil {
		return nil, err
	}
	v.event("identity-minted", map[string]any{"owner": req.Owner, "public_key": pub})
	return &Identity{Owner: req.Owner, PublicKey: pub, Seed: string(seed)}, nil
}
