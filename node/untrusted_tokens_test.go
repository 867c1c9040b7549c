package node_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// TestUntrusted_TokenRecords: join token records that are JSON but no token — an id that is
// not their key's, a public key that is no user nkey, no expiry, no uses, a negative use count
// — are logged and skipped: the bus admits none of their keys, and the vault keeps minting
// tokens that work. Before, any record that decoded was mirrored, and a key under a moved
// id or with a negative use count could connect to the bus.
func TestUntrusted_TokenRecords(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	future := time.Now().Add(time.Hour).UTC()
	type bogus struct {
		key  string
		kp   nkeys.KeyPair
		json map[string]any
	}
	var planted []bogus
	plant := func(key string, fields map[string]any) {
		t.Helper()
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		rec := map[string]any{"public_key": pub, "mesh_id": b.n.Identity().MeshID, "created": time.Now().UTC(), "expires": future, "uses": 1, "used": 0}
		for k, v := range fields {
			rec[k] = v
		}
		body, _ := json.Marshal(rec)
		b.kvPut(vault.Bucket, key, string(body))
		planted = append(planted, bogus{key: key, kp: kp, json: rec})
	}
	plant("token.moved", map[string]any{"id": "elsewhere"})
	plant("token.noid", map[string]any{"id": ""})
	plant("token.notakey", map[string]any{"id": "notakey", "public_key": "not-a-key"})
	plant("token.curve", map[string]any{"id": "curve", "public_key": newXKey(t)})
	plant("token.noexpiry", map[string]any{"id": "noexpiry", "expires": time.Time{}})
	plant("token.nouses", map[string]any{"id": "nouses", "uses": 0, "used": -1})
	plant("token.negative", map[string]any{"id": "negative", "used": -1})
	b.kvPut(vault.Bucket, "token.junk", "garbage")

	// A token minted after them reaches the vault's mirror after them (one ordered watch):
	// once the vault answers, it has read every bogus record.
	var tok api.Token
	if _, err := b.vault(api.VaultVerbToken, api.VaultRequest{TTL: "1h"}, &tok); err != nil {
		t.Fatalf("token create after bogus records: %v", err)
	}
	bearer, err := vault.ParseToken(tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t, b.n.ClientURL(), writeSeed(t, bearer.Seed))
	nc.Close()

	for _, p := range planted {
		pub, _ := p.kp.PublicKey()
		nc, err := nats.Connect(b.n.ClientURL(), nats.Nkey(pub, p.kp.Sign), nats.MaxReconnects(0))
		if err == nil {
			nc.Close()
			t.Errorf("the bus admitted the key of bogus record %s %v", p.key, p.json)
			continue
		}
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("connect with the key of %s: %v, want an authorization refusal", p.key, err)
		}
	}

	// The vault keeps working: secrets and a second token.
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: api.VaultCallerOperator, Name: "smtp"}, nil); err != nil {
		t.Fatalf("mint after bogus token records: %v", err)
	}
	var again api.Token
	if _, err := b.vault(api.VaultVerbToken, api.VaultRequest{TTL: "1h"}, &again); err != nil || again.ID == tok.ID {
		t.Fatalf("a second token: %+v, %v", again, err)
	}
}
