package vault

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshnode/meshnode/api"
	"github.com/nats-io/nkeys"
)

// ProvisionName is the record, among a consumer's secrets, that keeps its credential of
// iface.
func ProvisionName(iface string) string { return reservedPrefix + "provision-" + iface }

// intakeInfo derives the vault's intake xkey from the barrier key: every server of the mesh
// holds the same key, so a credential sealed to it opens at whichever server holds the
// vault seat when it arrives.
const intakeInfo = "meshnode vault intake xkey v1"

// intakeKey returns the vault's intake xkey: providers seal credentials to its public key.
func intakeKey(barrier []byte) (nkeys.KeyPair, error) {
	seed, err := hkdf.Key(sha256.New, barrier, nil, intakeInfo, 32)
	if err != nil {
		return nil, err
	}
	return nkeys.CreateCurveKeysWithRand(bytes.NewReader(seed))
}

// keepProvision opens a provider's sealed credential for req.Owner's interface req.Name
// and keeps it, barrier-encrypted, as the consumer's ProvisionName record (replacing an
// earlier one). The credential is never seen in clear by the caller that carried it.
func (v *Vault) keepProvision(ctx context.Context, req api.VaultRequest) ([]api.VaultMeta, error) {
	if err := checkNames(req.Owner, req.Name); err != nil {
		return nil, err
	}
	plain, err := v.intake.Open(req.Sealed, req.Sender)
	if err != nil {
		return nil, fmt.Errorf("the %s credential for %s does not open with the vault's intake key: the provider must seal it to the request's xkey", req.Name, req.Owner)
	}
	var p api.Provisioned
	if err := json.Unmarshal(plain, &p); err != nil {
		return nil, fmt.Errorf("the %s credential for %s is not {\"env\": {…}}: %w", req.Name, req.Owner, err)
	}
	if err := p.Check(req.Name); err != nil {
		return nil, err
	}
	r, err := v.replace(ctx, req.Owner, ProvisionName(req.Name), string(plain))
	if err != nil {
		return nil, err
	}
	v.event(ctx, "provision-kept", map[string]any{"owner": req.Owner, "interface": req.Name, "version": r.Versions[0].Version})
	return []api.VaultMeta{meta(r)}, nil
}

// dropProvision forgets req.Owner's credential of interface req.Name, history included.
func (v *Vault) dropProvision(ctx context.Context, req api.VaultRequest) error {
	if err := checkNames(req.Owner, req.Name); err != nil {
		return err
	}
	key := secretKey(req.Owner, ProvisionName(req.Name))
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	if r, _, _ := v.load(ctx, req.Owner, ProvisionName(req.Name)); r == nil {
		return nil
	}
	if err := v.kv.Purge(ctx, key); err != nil {
		return err
	}
	if err := v.awaitMirror(ctx, key, func(_ recordEntry, ok bool) bool { return !ok }); err != nil {
		return err
	}
	v.event(ctx, "provision-dropped", map[string]any{"owner": req.Owner, "interface": req.Name})
	return nil
}

// provisioned returns owner's credentials of ifaces, by interface.
func (v *Vault) provisioned(ctx context.Context, owner string, ifaces []string) (map[string]api.Provisioned, error) {
	out := map[string]api.Provisioned{}
	for _, iface := range ifaces {
		plain, found, err := v.current(ctx, owner, ProvisionName(iface))
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("the vault keeps no %s credential of %s yet: it is provisioned before the module starts (`meshnode provisions`)", iface, owner)
		}
		var p api.Provisioned
		if err := json.Unmarshal([]byte(plain), &p); err != nil {
			return nil, fmt.Errorf("%s's %s credential: %w", owner, iface, err)
		}
		out[iface] = p
	}
	return out, nil
}

// maxGivenValue bounds a secret value the operator gives (mint or rotate with a value).
const maxGivenValue = 16 << 10

// newValue is a new secret version's value: the one the request carries sealed to the
// intake key (an external secret the operator gives: `vault mint NAME --value-stdin`), or a
// random one.
func (v *Vault) newValue(req api.VaultRequest) (string, error) {
	if len(req.Sealed) == 0 {
		return randomValue()
	}
	plain, err := v.intake.Open(req.Sealed, req.Sender)
	if err != nil {
		return "", errors.New("the value does not open with the vault's intake key: seal it to the key the intake verb answers")
	}
	if len(plain) == 0 || len(plain) > maxGivenValue {
		return "", fmt.Errorf("a secret's value is 1 to %d bytes, and this one is %d", maxGivenValue, len(plain))
	}
	return string(plain), nil
}
