package vault

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/nats-io/nkeys"
)

// SeedName is the record, among a module's secrets, that keeps the module's nkey seed
// (barrier-encrypted like any secret) for the hosts that run it. reservedPrefix begins every
// name the mesh keeps for itself: the operator's mint, rotate and fetch refuse them, and no
// manifest may declare one.
const (
	SeedName       = "mesh-seed"
	reservedPrefix = "mesh-"
)

// keepSeed records seed as owner's SeedName, replacing any earlier one (a rotated key's).
func (v *Vault) keepSeed(ctx context.Context, owner, seed string) error {
	_, err := v.replace(ctx, owner, SeedName, seed)
	return err
}

// current opens the current version of owner's secret name; found is false when there is
// none. (No event: the mesh's own records are read for the hosts, which the caller records.)
func (v *Vault) current(ctx context.Context, owner, name string) (value string, found bool, err error) {
	r, _, err := v.load(ctx, owner, name)
	if err != nil || r == nil {
		return "", false, err
	}
	value, err = v.unseal(r.Owner, r.Name, r.Versions[len(r.Versions)-1])
	return value, err == nil, err
}

// replace keeps value as owner's secret name, one version only: the next number, the earlier
// versions gone (the record's outbox kept). The mesh's own records (the seed, provisioned
// credentials) have no grace period: their holders fetch the current one.
func (v *Vault) replace(ctx context.Context, owner, name, value string) (*secretRecord, error) {
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	prev, rev, err := v.load(ctx, owner, name)
	if err != nil {
		return nil, err
	}
	next := 1
	if prev != nil {
		next = prev.Versions[len(prev.Versions)-1].Version + 1
	}
	nonce, ct, err := v.seal(owner, name, next, value)
	if err != nil {
		return nil, err
	}
	r := &secretRecord{Owner: owner, Name: name, Versions: []version{{Version: next, Created: time.Now().UTC(), Nonce: nonce, Cipher: ct}}}
	if prev != nil {
		r.Outbox = prev.Outbox
	}
	return r, v.store(ctx, r, rev)
}

// moduleCredentials answers a server's api.VaultVerbModule: the module's seed and the secrets its
// declaration names, when the server's current declaration runs the module. The reply is
// sealed to the server's recorded xkey (checked before this is called).
func (v *Vault) moduleCredentials(ctx context.Context, req api.VaultRequest) (*api.ModuleCredentials, error) {
	if v.cfg.Declared == nil {
		return nil, fmt.Errorf("this vault cannot read declarations")
	}
	m, ok := v.cfg.Declared(ctx, req.Node, req.Owner)
	if !ok {
		return nil, fmt.Errorf("node %s's declaration does not run module %s: a node receives only the credentials of the modules it runs", req.Node, req.Owner)
	}
	seed, found, err := v.current(ctx, req.Owner, SeedName)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("the vault keeps no seed of module %s (it was registered before deployments existed): give it a new key with `meshnode module register FILE --rotate-key`, then deploy again", req.Owner)
	}
	kp, err := nkeys.FromSeed([]byte(seed))
	if err != nil {
		return nil, fmt.Errorf("module %s's kept seed: %w", req.Owner, err)
	}
	pub, _ := kp.PublicKey()
	if pub != m.PublicKey {
		return nil, fmt.Errorf("module %s's kept seed is for key %s, and the declaration names %s: register it again with --rotate-key", req.Owner, pub, m.PublicKey)
	}
	out := &api.ModuleCredentials{Module: req.Owner, PublicKey: pub, Seed: seed}
	declared, _ := v.cfg.Secrets(req.Owner)
	for _, name := range m.Secrets {
		if !slices.Contains(declared, name) {
			return nil, fmt.Errorf("module %s does not declare secret %s", req.Owner, name)
		}
		s, err := v.fetch(ctx, api.VaultRequest{Owner: req.Owner, Name: name})
		if err != nil {
			return nil, fmt.Errorf("module %s: %w", req.Owner, err)
		}
		if out.Secrets == nil {
			out.Secrets = map[string]string{}
		}
		out.Secrets[name] = s.Value
	}
	if len(m.Provisions) > 0 {
		if out.Provisions, err = v.provisioned(ctx, req.Owner, m.Provisions); err != nil {
			return nil, err
		}
	}
	v.event(ctx, "module-credentials", map[string]any{"node": req.Node, "module": req.Owner, "secrets": m.Secrets, "provisions": m.Provisions})
	return out, nil
}
