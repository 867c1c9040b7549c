package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/seats"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// Issue 11, untrusted input: whatever sits in the mesh's buckets is read defensively. Each
// test writes foreign values with the node's own JetStream, as an attacker once made the node
// do, and shows the node keeps working.

// kvPut writes value at key of bucket through the operator's (full) JetStream access.
func (b *bed) kvPut(bucket, key, value string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := b.js.KeyValue(ctx, bucket)
	if err != nil {
		b.t.Fatalf("bucket %s: %v", bucket, err)
	}
	if _, err := kv.Put(ctx, key, []byte(value)); err != nil {
		b.t.Fatalf("put %s %s: %v", bucket, key, err)
	}
}

// TestUntrusted_VaultRecords: garbage secret records (no versions, not JSON, a record moved
// to another name, a short nonce) are skipped: list, fetch and mint keep working, and a mint
// replaces a bad record. Before, a record without versions panicked every vault verb.
func TestUntrusted_VaultRecords(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	var minted api.Secret
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: api.VaultCallerOperator, Name: "smtp"}, &minted); err != nil {
		t.Fatal(err)
	}
	b.kvPut(vault.Bucket, "secret.operator.empty", `{"owner":"operator","name":"empty"}`)
	b.kvPut(vault.Bucket, "secret.operator.junk", `garbage`)
	b.kvPut(vault.Bucket, "secret.operator.moved", `{"owner":"operator","name":"smtp","versions":[{"version":1,"nonce":"AAAAAAAAAAAAAAAA","cipher":"AAAAAAAAAAAAAAAAAAAAAA=="}]}`)
	b.kvPut(vault.Bucket, "secret.operator.short", `{"owner":"operator","name":"short","versions":[{"version":1,"nonce":"AA==","cipher":"AA=="}]}`)
	b.kvPut(vault.Bucket, "secret.operator.last", `{"owner":"operator","name":"last"}`)

	// A mint of the last bad name conflicts until the vault's mirror holds that record (and
	// so every one written before it), then replaces it.
	retryUntil(t, 10*time.Second, func() error {
		_, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: api.VaultCallerOperator, Name: "last"}, nil)
		return err
	})

	metas, err := b.vault(api.VaultVerbList, api.VaultRequest{Owner: api.VaultCallerOperator}, nil)
	if err != nil {
		t.Fatalf("list with bad records in the bucket: %v", err)
	}
	var names []string
	for _, m := range metas {
		names = append(names, m.Name)
	}
	if want := []string{"last", "smtp"}; !slices.Equal(names, want) {
		t.Fatalf("list=%v, want %v (bad records skipped)", names, want)
	}
	var got api.Secret
	if _, err := b.vault(api.VaultVerbFetch, api.VaultRequest{Owner: api.VaultCallerOperator, Name: "smtp"}, &got); err != nil || got.Value != minted.Value {
		t.Fatalf("fetch smtp: %v (value equal: %v)", err, got.Value == minted.Value)
	}
	for _, name := range []string{"empty", "junk", "moved", "short"} {
		if _, err := b.vault(api.VaultVerbFetch, api.VaultRequest{Owner: api.VaultCallerOperator, Name: name}, nil); !errors.Is(err, vault.ErrRefused) || !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("fetch of bad record %s: %v, want a refusal saying it does not exist", name, err)
		}
		if _, err := b.vault(api.VaultVerbRotate, api.VaultRequest{Owner: api.VaultCallerOperator, Name: name}, nil); !errors.Is(err, vault.ErrRefused) {
			t.Errorf("rotate of bad record %s: %v, want a refusal", name, err)
		}
	}
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: api.VaultCallerOperator, Name: "empty"}, nil); err != nil {
		t.Fatalf("mint over a bad record: %v", err)
	}
	if _, err := b.vault(api.VaultVerbFetch, api.VaultRequest{Owner: api.VaultCallerOperator, Name: "empty"}, nil); err != nil {
		t.Fatalf("fetch of the secret minted over a bad record: %v", err)
	}
}

// TestUntrusted_RegistryRecords: garbage module records and identities are skipped: a garbage
// operator key does not lock the operator out, a garbage record over a registered module
// leaves its last good registration in force, the others are listed, and a module can be
// registered over a garbage record.
func TestUntrusted_RegistryRecords(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, apiMod := b.register("module: api\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	b.kvPut(registry.Bucket, "module.ghost", `garbage`)
	b.kvPut(registry.Bucket, "module.api", `{"module":"api"}`)
	b.kvPut(registry.Bucket, "module.thief", fmt.Sprintf(`{"module":"thief","public_key":%q,"manifest":"module: thief\nrequires: [mesh-bus]\n"}`, apiMod.PublicKey))
	b.kvPut(registry.Bucket, "identity.operator", `not-a-key`)
	b.kvPut(registry.Bucket, "identity.vault", `{}`)
	b.kvPut(registry.Bucket, "identity.node.alpha", `[]`)
	// A registration returns once the node's mirror holds it, and so every write before it.
	b.register("module: beta\nrequires: [mesh-bus]\n")

	op := b.operatorConn() // the operator's key still admits it
	defer op.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mods, err := admin.List(ctx, op)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.Module)
		if m.Module == "api" && m.PublicKey != apiMod.PublicKey {
			t.Errorf("api's key is %s, want %s", m.PublicKey, apiMod.PublicKey)
		}
	}
	if want := []string{"api", "beta"}; !slices.Equal(names, want) {
		t.Fatalf("modules=%v, want %v", names, want)
	}
	c := b.client(seed) // api's last good registration stays in force
	if _, err := c.Emit(ctx, "order.placed", map[string]string{"id": "1"}); err != nil {
		t.Fatalf("api emits after a garbage record over its registration: %v", err)
	}
	if _, reg := b.register("module: ghost\nrequires: [mesh-bus]\n"); !reg.Created {
		t.Fatal("ghost over a garbage record: not created")
	}
	if _, reg := b.register("module: api\nrequires: [mesh-bus]\nemits: [order.placed, order.paid]\n"); reg.Created || reg.PublicKey != apiMod.PublicKey {
		t.Fatalf("api re-registered over a garbage record: created=%v key=%s", reg.Created, reg.PublicKey)
	}
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: api.VaultCallerOperator, Name: "after"}, nil); err != nil {
		t.Fatalf("vault after garbage identities: %v", err)
	}
}

// TestUntrusted_SeatLeases: a garbage value over the mesh-controller's lease (or a lease
// stored at another seat's key) holds no seat: it is deleted and the controller answers
// again. Before, no node could acquire the seat again, for good.
func TestUntrusted_SeatLeases(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: api\nrequires: [mesh-bus]\n")
	b.kvPut(seats.Bucket, manifest.ControllerSeat, `garbage`)
	b.kvPut(seats.Bucket, "other", `{"seat":"mesh-controller","scope":"mesh","node":"alpha","instance":"x"}`)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := b.js.KeyValue(ctx, seats.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		if _, err := kv.Get(ctx, "other"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("the lease stored at the wrong key is still there (%v)", err)
		}
		e, err := kv.Get(ctx, manifest.ControllerSeat)
		if err != nil {
			return fmt.Errorf("no controller lease yet: %w", err)
		}
		if !strings.Contains(string(e.Value()), `"seat":"mesh-controller"`) {
			return fmt.Errorf("controller lease is %q", e.Value())
		}
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		mods, err := admin.List(rctx, b.op)
		if err != nil {
			return err
		}
		if len(mods) != 1 || mods[0].Module != "api" {
			return fmt.Errorf("modules=%v", mods)
		}
		return nil
	})
}

// padded is a valid manifest of module made about size bytes long by comment lines.
func padded(module string, size int) string {
	head := "module: " + module + "\nrequires: [mesh-bus]\nemits: [tick]\n"
	line := "# " + strings.Repeat("padding ", 8) + "\n"
	return head + strings.Repeat(line, (size-len(head))/len(line))
}

// TestInputLimits_ManifestSize: a manifest over manifest.MaxSize is refused by the controller
// itself (not only by the client), naming the size and the limit, and nothing is minted or
// registered; module list is paged, so twenty modules of 60 KB manifests (1.2 MB in all)
// still list. Before, a 760 KB manifest registered, its reply did not fit and the list failed
// for everyone.
func TestInputLimits_ManifestSize(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	big := padded("big", 760_000)
	req, _ := json.Marshal(api.RegisterRequest{Manifest: big, XKey: "XAAAA"})
	msg, err := b.op.RequestWithContext(ctx, api.RegisterSubject, req)
	if err != nil {
		t.Fatalf("register a 760 KB manifest: %v", err)
	}
	var reply api.RegisterReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		t.Fatal(err)
	}
	if reply.Error == "" || len(reply.Refusals) != 1 || reply.Refusals[0].Code != manifest.CodeSize ||
		!strings.Contains(reply.Refusals[0].Error(), strconv.Itoa(manifest.MaxSize)) || !strings.Contains(reply.Refusals[0].Error(), strconv.Itoa(len(big))) {
		t.Fatalf("reply=%+v, want one size refusal naming %d and the limit %d", reply, len(big), manifest.MaxSize)
	}
	if _, err := admin.Register(ctx, b.op, []byte(big)); !errors.Is(err, admin.ErrRefused) {
		t.Fatalf("admin.Register of a 760 KB manifest: %v, want ErrRefused", err)
	}

	want := []string{}
	for i := range 20 {
		name := fmt.Sprintf("m%02d", i)
		b.register(padded(name, 60_000))
		want = append(want, name)
	}
	mods, err := admin.List(ctx, b.op)
	if err != nil {
		t.Fatalf("list of 20 modules of 60 KB manifests: %v", err)
	}
	var got []string
	for _, m := range mods {
		got = append(got, m.Module)
		if len(m.Manifest) < 59_000 {
			t.Errorf("module %s listed with a manifest of %d bytes", m.Module, len(m.Manifest))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	// One page is bounded: the first holds fewer than all twenty, and says where to go on.
	msg, err = b.op.RequestWithContext(ctx, api.ListSubject, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var page api.ListReply
	json.Unmarshal(msg.Data, &page)
	if len(msg.Data) > api.ListPageBytes+4096 || page.Next == "" || len(page.Modules) == 0 || len(page.Modules) >= 20 {
		t.Fatalf("first page: %d bytes, %d modules, next %q", len(msg.Data), len(page.Modules), page.Next)
	}
}

// TestInputLimits_RotateKey: a registered module whose seed was lost gets a new key through
// the vault; the old key's connections are kicked and the old key no longer connects.
func TestInputLimits_RotateKey(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	text := "module: api\nrequires: [mesh-bus]\nemits: [tick]\n"
	oldSeed, first := b.register(text)
	oldConn := b.raw(oldSeed, "api")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := admin.RotateKey(ctx, b.op, []byte("module: ghost\nrequires: [mesh-bus]\n")); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("rotating the key of an unregistered module: %v", err)
	}
	reg, err := admin.RotateKey(ctx, b.op, []byte(text))
	if err != nil {
		t.Fatalf("rotate key: %v", err)
	}
	if !reg.Rotated || reg.Created || len(reg.Seed) == 0 || reg.PublicKey == first.PublicKey {
		t.Fatalf("rotated=%v created=%v seed=%d bytes key %s (was %s)", reg.Rotated, reg.Created, len(reg.Seed), reg.PublicKey, first.PublicKey)
	}
	kp, err := nkeys.FromSeed(reg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	if pub, _ := kp.PublicKey(); pub != reg.PublicKey {
		t.Fatalf("the sealed seed is of %s, the registration %s", pub, reg.PublicKey)
	}
	retryUntil(t, 10*time.Second, func() error {
		if oldConn.IsConnected() && oldConn.Status() == nats.CONNECTED {
			if err := oldConn.Flush(); err == nil {
				return errors.New("the old key's connection is still up")
			}
		}
		return nil
	})
	if _, err := sdk.Connect(ctx, b.n.ClientURL(), oldSeed); err == nil {
		t.Fatal("the old seed still connects")
	}
	newSeed := filepath.Join(t.TempDir(), "api.nk")
	os.WriteFile(newSeed, reg.Seed, 0o600)
	c := b.client(newSeed)
	if _, err := c.Emit(ctx, "tick", map[string]int{"n": 1}); err != nil {
		t.Fatalf("emit with the new seed: %v", err)
	}
}
