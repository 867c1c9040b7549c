package vault_test

import (
	"bytes"
	"testing"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/recovery"
	"github.com/meshnode/meshnode/vault"
)

// The operator, and only the operator, receives the recovery key and the foundation sealed
// under it; the key opens the foundation.
func TestVault_RecoveryKeyAndFoundation(t *testing.T) {
	b := newBed(t, nil, 0)
	op := b.operator(t)
	var rk api.RecoveryKey
	mustCall(t, op, api.VaultVerbRecoveryKey, api.VaultCallerOperator, api.VaultRequest{}, &rk)
	barrier, err := recovery.ParseKey(rk.Key)
	if err != nil || !bytes.Equal(barrier, b.barrier) || rk.MeshID != meshID {
		t.Fatalf("recovery key %+v reads as %x, %v; want the barrier key of mesh %s", rk, barrier, err, meshID)
	}
	var sealed api.SealedFoundation
	mustCall(t, op, api.VaultVerbFoundation, api.VaultCallerOperator, api.VaultRequest{}, &sealed)
	f, err := recovery.Open(barrier, &sealed)
	if err != nil {
		t.Fatal(err)
	}
	if string(f.RouteSecret) != "route" || len(f.VaultSeed) == 0 || sealed.MeshID != meshID {
		t.Fatalf("the sealed foundation opens to %+v of mesh %s", f, sealed.MeshID)
	}
	for _, verb := range []string{api.VaultVerbRecoveryKey, api.VaultVerbFoundation} {
		_, err := call(t, op, verb, api.VaultCallerNode, api.VaultRequest{}, &api.RecoveryKey{})
		refused(t, verb+" as a node", err, "only the operator")
		_, err = call(t, b.module(t, "shop"), verb, api.VaultModuleCaller("shop"), api.VaultRequest{}, &api.RecoveryKey{})
		refused(t, verb+" as a module", err)
	}
}

// TestVault_SealedFoundation_NotEnrolled: a server without the vault (nil) says it cannot
// seal the foundation yet, instead of panicking: a scheduled snapshot reports that.
func TestVault_SealedFoundation_NotEnrolled(t *testing.T) {
	var v *vault.Vault
	if sealed, err := v.SealedFoundation(); err == nil || sealed != nil {
		t.Fatalf("SealedFoundation() on no vault = %v, %v; want an error", sealed, err)
	}
}
