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

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/mirror"
	"github.com/meshnode/meshnode/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

// secretRecord is one secret at rest: its versions, each encrypted under the barrier key
// with the record's name and version as additional data (a ciphertext cannot be moved to
// another name).
type secretRecord struct {
	Owner    string    `json:"owner"`
	Name     string    `json:"name"`
	Versions []version `json:"versions"`
	// Outbox holds the events of actions stored with the record and not yet published.
	Outbox []outbox.Event `json:"outbox,omitempty"`
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
	if owner != api.VaultCallerOperator && !manifest.ValidName(owner) {
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

// load returns a secret record from the mirror (nil when there is none) and its revision.
// The mirror follows the bucket through a watch; writes below wait for it, so a fetch right
// after a mint or rotate sees the new version. A bad record (see applyRecord) is no secret:
// load returns nil and its revision, so that a mint replaces it.
func (v *Vault) load(_ context.Context, owner, name string) (*secretRecord, uint64, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	e, ok := v.records[secretKey(owner, name)]
	if !ok {
		return nil, 0, nil
	}
	if len(e.rec.Versions) == 0 {
		return nil, e.rev, nil
	}
	r := e.rec
	r.Versions = slices.Clone(r.Versions)
	r.Outbox = slices.Clone(r.Outbox)
	return &r, e.rev, nil
}

func (v *Vault) applyRecord(e jetstream.KeyValueEntry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(v.records, e.Key())
		return
	}
	r, err := v.decodeRecord(e.Key(), e.Value())
	if err != nil {
		// Anything may sit in the bucket (a foreign write, a damaged store): the record is
		// no secret. It is kept without versions, for its revision only, so that a mint of
		// that name replaces it instead of conflicting with it for ever.
		v.log.Error("vault record refused: skipped; mint the secret again to replace it",
			"key", e.Key(), "revision", e.Revision(), "err", err)
		v.records[e.Key()] = recordEntry{rev: e.Revision()}
		return
	}
	v.records[e.Key()] = recordEntry{rec: r, rev: e.Revision()}
}

// decodeRecord reads a secret record from the bucket: untrusted input, checked for
// everything the vault later relies on, so that no read indexes past what is there.
func (v *Vault) decodeRecord(key string, value []byte) (secretRecord, error) {
	var r secretRecord
	if err := json.Unmarshal(value, &r); err != nil {
		return secretRecord{}, fmt.Errorf("not a secret record: %w", err)
	}
	if err := checkNames(r.Owner, r.Name); err != nil {
		return secretRecord{}, err
	}
	if want := secretKey(r.Owner, r.Name); key != want {
		return secretRecord{}, fmt.Errorf("the record names %s/%s, whose key is %s", r.Owner, r.Name, want)
	}
	if len(r.Versions) == 0 {
		return secretRecord{}, errors.New("the record has no version")
	}
	if err := outbox.Check(r.Outbox, isRecordAction); err != nil {
		return secretRecord{}, err
	}
	prev := 0
	for _, ver := range r.Versions {
		switch {
		case ver.Version <= prev:
			return secretRecord{}, fmt.Errorf("version %d follows version %d: versions must increase", ver.Version, prev)
		case len(ver.Nonce) != v.aead.NonceSize():
			return secretRecord{}, fmt.Errorf("version %d: the nonce is %d bytes, not %d", ver.Version, len(ver.Nonce), v.aead.NonceSize())
		case len(ver.Cipher) < v.aead.Overhead():
			return secretRecord{}, fmt.Errorf("version %d: the ciphertext is %d bytes, shorter than its tag", ver.Version, len(ver.Cipher))
		}
		prev = ver.Version
	}
	return r, nil
}

// awaitRecord waits until the mirror holds revision rev of key.
func (v *Vault) awaitRecord(ctx context.Context, key string, rev uint64) error {
	return v.awaitMirror(ctx, key, func(e recordEntry, ok bool) bool { return ok && e.rev >= rev })
}

// awaitMirror waits until the mirror's entry of key (ok: there is one) is what done wants.
func (v *Vault) awaitMirror(ctx context.Context, key string, done func(e recordEntry, ok bool) bool) error {
	defer v.watch.Awaiting(ctx, func(err error) {
		if err != nil {
			v.log.Warn("the vault's watch has not delivered a write; it cannot be resumed yet", "key", key, "err", err)
			return
		}
		v.log.Warn("the vault's watch had not delivered a write; resumed", "key", key)
	})()
	for {
		v.mu.RLock()
		e, ok := v.records[key]
		v.mu.RUnlock()
		if done(e, ok) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vault mirror did not see %s change: %w", key, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

func (v *Vault) store(ctx context.Context, r *secretRecord, rev uint64) error {
	b, _ := json.Marshal(r)
	key := secretKey(r.Owner, r.Name)
	var err error
	var next uint64
	if rev == 0 {
		next, err = v.kv.Create(ctx, key, b)
	} else {
		next, err = v.kv.Update(ctx, key, b, rev)
	}
	if mirror.Conflict(err) {
		return fmt.Errorf("secret %s/%s changed meanwhile; try again", r.Owner, r.Name)
	}
	if err != nil {
		return err
	}
	return v.awaitRecord(ctx, key, next)
}

// isRecordAction reports whether name is an action stored with a secret record's outbox.
func isRecordAction(name string) bool { return name == "minted" || name == "rotated" }

// mint creates a secret (version 1) with a random value, or the one the request carries
// sealed to the vault's intake key (newValue).
func (v *Vault) mint(ctx context.Context, req api.VaultRequest) (*api.Secret, error) {
	if err := checkNames(req.Owner, req.Name); err != nil {
		return nil, err
	}
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	prev, rev, err := v.load(ctx, req.Owner, req.Name)
	if err != nil {
		return nil, err
	}
	if prev != nil {
		return nil, fmt.Errorf("secret %s of %s exists (version %d); rotate it instead", req.Name, req.Owner, meta(prev).Version)
	}
	value, err := v.newValue(req)
	if err != nil {
		return nil, err
	}
	nonce, ct, err := v.seal(req.Owner, req.Name, 1, value)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	r := &secretRecord{Owner: req.Owner, Name: req.Name, Versions: []version{{Version: 1, Created: now, Nonce: nonce, Cipher: ct}}}
	if err := v.addOutbox(r, "minted", map[string]any{"owner": req.Owner, "name": req.Name, "version": 1}); err != nil {
		return nil, err
	}
	// rev is a bad record's, which the new one replaces; 0 when there is none.
	if err := v.store(ctx, r, rev); err != nil {
		return nil, err
	}
	v.flushLater(ctx, secretKey(r.Owner, r.Name))
	return &api.Secret{VaultMeta: api.VaultMeta{Owner: req.Owner, Name: req.Name, Version: 1, Versions: []int{1}, Created: now}, Value: value}, nil
}

// rotate adds a new version; the previous stays readable for the grace period.
func (v *Vault) rotate(ctx context.Context, req api.VaultRequest) (*api.Secret, error) {
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
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
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
	value, err := v.newValue(req)
	if err != nil {
		return nil, err
	}
	nonce, ct, err := v.seal(req.Owner, req.Name, next, value)
	if err != nil {
		return nil, err
	}
	r.Versions = append(live, version{Version: next, Created: now, Nonce: nonce, Cipher: ct})
	if err := v.addOutbox(r, "rotated", map[string]any{"owner": req.Owner, "name": req.Name, "version": next, "previous_until": until}); err != nil {
		return nil, err
	}
	if err := v.store(ctx, r, rev); err != nil {
		return nil, err
	}
	v.flushLater(ctx, secretKey(r.Owner, r.Name))
	return &api.Secret{VaultMeta: meta(r), Value: value}, nil
}

// fetch returns the current version, or a requested one that is still readable.
func (v *Vault) fetch(ctx context.Context, req api.VaultRequest) (*api.Secret, error) {
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
	v.event(ctx, "fetched", map[string]any{"owner": req.Owner, "name": req.Name, "version": ver.Version})
	m := meta(r)
	m.Version, m.Created = ver.Version, ver.Created
	return &api.Secret{VaultMeta: m, Value: value}, nil
}

func meta(r *secretRecord) api.VaultMeta {
	m := api.VaultMeta{Owner: r.Owner, Name: r.Name}
	now := time.Now()
	for _, ver := range r.Versions {
		if ver.Until == nil || ver.Until.After(now) {
			m.Versions = append(m.Versions, ver.Version)
		}
	}
	if len(r.Versions) == 0 {
		return m // never from the mirror: decodeRecord refuses a record without versions
	}
	last := r.Versions[len(r.Versions)-1]
	m.Version, m.Created = last.Version, last.Created
	return m
}

// list returns every secret's metadata (of one owner, if given), by owner and name.
func (v *Vault) list(_ context.Context, owner string) ([]api.VaultMeta, error) {
	v.mu.RLock()
	out := []api.VaultMeta{}
	for _, e := range v.records {
		if len(e.rec.Versions) == 0 {
			continue // a bad record, kept for its revision only
		}
		if (owner == "" || e.rec.Owner == owner) && e.rec.Name != SeedName {
			out = append(out, meta(&e.rec))
		}
	}
	v.mu.RUnlock()
	slices.SortFunc(out, func(a, b api.VaultMeta) int { return strings.Compare(a.Owner+"/"+a.Name, b.Owner+"/"+b.Name) })
	return out, nil
}

// identity mints an nkey identity for owner (a module at registration, the operator at
// handoff) and records its public key; the seed exists only in the sealed reply.
func (v *Vault) identity(ctx context.Context, req api.VaultRequest) (*api.Identity, error) {
	if req.Owner != api.VaultCallerOperator && !manifest.ValidName(req.Owner) {
		return nil, fmt.Errorf("owner %q is not a module name", req.Owner)
	}
	kp, err := MintUser()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	rec, _ := json.Marshal(map[string]any{"owner": req.Owner, "public_key": pub, "created": time.Now().UTC()})
	if _, err := v.kv.Put(ctx, "identity."+req.Owner+"."+pub, rec); err != nil {
		return nil, err
	}
	if req.Owner != api.VaultCallerOperator {
		// Kept, barrier-encrypted, for the hosts that will run the module (api.VaultVerbModule).
		if err := v.keepSeed(ctx, req.Owner, string(seed)); err != nil {
			return nil, fmt.Errorf("keep module %s's seed: %w", req.Owner, err)
		}
	}
	v.event(ctx, "identity-minted", map[string]any{"owner": req.Owner, "public_key": pub})
	return &api.Identity{Owner: req.Owner, PublicKey: pub, Seed: string(seed)}, nil
}

// Bad lists the keys of secret records that were refused (they do not decode or validate):
// no secret until a mint of that name replaces them.
func (v *Vault) Bad() []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []string
	for k, e := range v.records {
		if len(e.rec.Versions) == 0 {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
