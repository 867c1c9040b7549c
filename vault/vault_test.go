package vault_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// wait bounds each request and each wait for the bucket.
const wait = 10 * time.Second

// meshID is the bed's mesh.
const meshID = "m1"

// bed is one embedded JetStream server with a vault serving on it.
type bed struct {
	srv     *server.Server
	js      jetstream.JetStream
	vault   *vault.Vault
	barrier []byte
	node    *serverKeys // the one server of the mesh the vault knows
	limited atomic.Int64
	// served counts the requests the vault answered, refused ones apart.
	served, refused atomic.Int64
	// admit refuses these node names (a server's name already).
	taken string
}

// serverKeys are a server's recorded keys, as the registry would hold them.
type serverKeys struct {
	name string
	xkp  nkeys.KeyPair
	xpub string
}

// declared are the secrets each module's manifest declares.
var declared = map[string][]string{"shop": {"db-password", "api-key"}, "billing": {"stripe-key"}}

// newBed starts a server, the EVENTS stream of the vault's events, and a vault serving its
// tools with barrier (nil: a new key) and rateLimit; everything ends with the test.
func newBed(t *testing.T, barrier []byte, rateLimit int) *bed {
	t.Helper()
	// A nonce lets a join token's holder connect with its nkey (the bus would check it).
	b := &bed{srv: testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir(), AlwaysEnableNonce: true}), taken: "n1"}
	_, b.js = testbed.Connect(t, b.srv)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{api.VaultEventSubject(">")}}); err != nil {
		t.Fatal(err)
	}
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	b.node = &serverKeys{name: "n1", xkp: xkp, xpub: xpub}
	if barrier == nil {
		barrier = make([]byte, 32)
		rand.Read(barrier)
	}
	b.barrier = barrier
	b.vault = b.open(t, barrier, rateLimit)
	if err := b.vault.Start(); err != nil {
		t.Fatal(err)
	}
	return b
}

// open opens a vault on the bed's bucket with barrier, watching until the test ends.
func (b *bed) open(t *testing.T, barrier []byte, rateLimit int) *vault.Vault {
	t.Helper()
	conn, _ := testbed.Connect(t, b.srv)
	responder, _ := testbed.Connect(t, b.srv)
	key, _ := nkeys.CreateUser()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	v, err := vault.Open(ctx, vault.Config{
		MeshID: meshID, Node: "n1", Conn: conn, Responder: responder, Key: key, BarrierKey: barrier, Replicas: 1,
		RateLimit: rateLimit,
		Served: func(_ string, refused bool, _ time.Duration) {
			if refused {
				b.refused.Add(1)
			} else {
				b.served.Add(1)
			}
		},
		RateLimited: func(string) { b.limited.Add(1) },
		Secrets: func(module string) ([]string, bool) {
			names, ok := declared[module]
			return names, ok
		},
		Enrolment: func() api.Enrolment {
			return api.Enrolment{MeshID: meshID, RouteSecret: []byte("route"), GossipKey: []byte("gossip"), BarrierKey: barrier, Expect: 3}
		},
		Admit: func(node string) error {
			if node == b.taken {
				return fmt.Errorf("mesh %s has a server named %s already: join with another --name", meshID, node)
			}
			return nil
		},
		Addrs: func() []string { return []string{b.srv.ClientURL()} },
		ServerXKey: func(node string) (string, bool) {
			if node == b.node.name {
				return b.node.xpub, true
			}
			return "", false
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	run, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); v.Watch(run) }()
	// Close first: it stops the watch itself, and the events still queued wait for their
	// records' writes to reach the mirror, which needs the watch.
	t.Cleanup(func() {
		if err := v.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		stop()
		<-done
	})
	return v
}

// operator is a connection for the operator's calls.
func (b *bed) operator(t *testing.T) *nats.Conn {
	t.Helper()
	nc, _ := testbed.Connect(t, b.srv)
	return nc
}

// module is a connection of module's, whose inbox is its own as the bus would make it.
func (b *bed) module(t *testing.T, module string) *nats.Conn {
	t.Helper()
	nc, _ := testbed.Connect(t, b.srv, nats.CustomInboxPrefix(manifest.InboxPrefix(module)))
	return nc
}

func call(t *testing.T, nc *nats.Conn, verb, caller string, req api.VaultRequest, out any) ([]api.VaultMeta, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return vault.Call(ctx, nc, verb, caller, req, out)
}

func mustCall(t *testing.T, nc *nats.Conn, verb, caller string, req api.VaultRequest, out any) []api.VaultMeta {
	t.Helper()
	meta, err := call(t, nc, verb, caller, req, out)
	if err != nil {
		t.Fatalf("%s as %s %+v: %v", verb, caller, req, err)
	}
	return meta
}

// refused checks that err is the vault's refusal and says each of says.
func refused(t *testing.T, what string, err error, says ...string) {
	t.Helper()
	if !errors.Is(err, vault.ErrRefused) {
		t.Fatalf("%s: %v, want the vault's refusal", what, err)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("%s: %q does not say %q", what, err, s)
		}
	}
}

// raw is the bucket's record at key, as stored.
func (b *bed) raw(t *testing.T, key string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kv, err := b.js.KeyValue(ctx, vault.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return e.Value()
}

// TestVault_MintFetchRotate: a minted secret is fetched as minted; a second mint is
// refused (rotate it); a rotation makes a new current version and keeps the previous one
// readable for its grace; list tells versions, never values; each refusal says what to do.
func TestVault_MintFetchRotate(t *testing.T) {
	b := newBed(t, nil, 0)
	op := b.operator(t)
	req := api.VaultRequest{Owner: "shop", Name: "db-password"}

	_, err := call(t, op, api.VaultVerbFetch, api.VaultCallerOperator, req, &api.Secret{})
	refused(t, "fetch before mint", err, "does not exist", "meshnode vault mint db-password --owner shop")
	_, err = call(t, op, api.VaultVerbRotate, api.VaultCallerOperator, req, &api.Secret{})
	refused(t, "rotate before mint", err, "mint it first")

	var v1 api.Secret
	mustCall(t, op, api.VaultVerbMint, api.VaultCallerOperator, req, &v1)
	if v1.Version != 1 || len(v1.Value) < 32 || v1.Owner != "shop" || v1.Name != "db-password" {
		t.Fatalf("minted %+v, want version 1 of shop/db-password with a random value", v1)
	}
	var got api.Secret
	mustCall(t, op, api.VaultVerbFetch, api.VaultCallerOperator, req, &got)
	if got.Value != v1.Value || got.Version != 1 {
		t.Fatalf("fetched %+v, want what was minted", got)
	}
	_, err = call(t, op, api.VaultVerbMint, api.VaultCallerOperator, req, &api.Secret{})
	refused(t, "a second mint", err, "exists", "rotate it instead")

	var v2 api.Secret
	rot := req
	rot.Grace = "1h"
	mustCall(t, op, api.VaultVerbRotate, api.VaultCallerOperator, rot, &v2)
	if v2.Version != 2 || v2.Value == v1.Value || !slices.Equal(v2.Versions, []int{1, 2}) {
		t.Fatalf("rotated to %+v, want version 2 with a new value, 1 still readable", v2)
	}
	mustCall(t, op, api.VaultVerbFetch, api.VaultCallerOperator, req, &got)
	if got.Value != v2.Value || got.Version != 2 {
		t.Fatalf("fetched %+v after the rotation, want version 2", got)
	}
	old := req
	old.Version = 1
	mustCall(t, op, api.VaultVerbFetch, api.VaultCallerOperator, old, &got)
	if got.Value != v1.Value || got.Version != 1 {
		t.Fatalf("fetched version 1 within its grace: %+v", got)
	}

	// No grace: the previous version is unreadable at once.
	rot.Grace = "0s"
	var v3 api.Secret
	mustCall(t, op, api.VaultVerbRotate, api.VaultCallerOperator, rot, &v3)
	_, err = call(t, op, api.VaultVerbFetch, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: "db-password", Version: 2}, &got)
	refused(t, "fetch of a version past its grace", err, "not readable", "readable: [1 3]") // 1 keeps its own hour
	rot.Grace = "soon"
	_, err = call(t, op, api.VaultVerbRotate, api.VaultCallerOperator, rot, &got)
	refused(t, "a grace that is no duration", err, `grace "soon" is not a duration`)

	mustCall(t, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "billing", Name: "stripe-key"}, &got)
	meta := mustCall(t, op, api.VaultVerbList, api.VaultCallerOperator, api.VaultRequest{}, nil)
	if len(meta) != 2 || meta[0].Owner != "billing" || meta[1].Name != "db-password" || meta[1].Version != 3 {
		t.Fatalf("list: %+v", meta)
	}
	if meta := mustCall(t, op, api.VaultVerbList, api.VaultCallerOperator, api.VaultRequest{Owner: "shop"}, nil); len(meta) != 1 {
		t.Fatalf("list of shop's: %+v", meta)
	}

	_, err = call(t, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: "Bad_Name"}, &got)
	refused(t, "a mint of a bad name", err, "lower-case letters, digits and '-'")
	_, err = call(t, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: vault.SeedName}, &got)
	refused(t, "a mint of a reserved name", err, "the mesh's own")
}

// TestVault_SealedToCaller: a reply that carries a secret is sealed to the xkey of the
// request, and holds the value in no other form: another xkey cannot open it; a request
// without an xkey is refused before anything is written.
func TestVault_SealedToCaller(t *testing.T) {
	b := newBed(t, nil, 0)
	op := b.operator(t)
	given := "correct horse battery staple"
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req := api.VaultRequest{Owner: "shop", Name: "api-key"}
	if err := vault.Give(ctx, op, api.VaultCallerOperator, &req, []byte(given)); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(req.Sealed, []byte(given)) {
		t.Fatal("the given value travels in clear")
	}
	mustCall(t, op, api.VaultVerbMint, api.VaultCallerOperator, req, &api.Secret{})

	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	body, _ := json.Marshal(api.VaultRequest{XKey: xpub, Owner: "shop", Name: "api-key"})
	msg, err := op.RequestWithContext(ctx, api.VaultToolSubject(api.VaultVerbFetch, api.VaultCallerOperator), body)
	if err != nil {
		t.Fatal(err)
	}
	whole := []byte(given)[:len(given)/3*3] // base64 of whole 3-byte groups shows whatever follows
	for _, form := range [][]byte{[]byte(given), []byte(base64.StdEncoding.EncodeToString(whole))} {
		if bytes.Contains(msg.Data, form) {
			t.Fatalf("the reply holds the value in clear: %s", msg.Data)
		}
	}
	var reply api.VaultReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Error != "" || len(reply.Sealed) == 0 {
		t.Fatalf("reply %s: %v", msg.Data, err)
	}
	plain, err := vault.Unseal(xkp, reply.Sender, reply.Sealed)
	if err != nil {
		t.Fatal(err)
	}
	var s api.Secret
	if err := json.Unmarshal(plain, &s); err != nil || s.Value != given {
		t.Fatalf("the sealed reply opens to %s (%v), want the given value", plain, err)
	}
	other, _ := nkeys.CreateCurveKeys()
	if _, err := vault.Unseal(other, reply.Sender, reply.Sealed); err == nil {
		t.Fatal("another xkey opened the reply")
	}

	body, _ = json.Marshal(api.VaultRequest{Owner: "shop", Name: "new-one"})
	msg, err = op.RequestWithContext(ctx, api.VaultToolSubject(api.VaultVerbMint, api.VaultCallerOperator), body)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil || !strings.Contains(reply.Error, "send your xkey public key") {
		t.Fatalf("a mint without an xkey: %s", msg.Data)
	}
	if meta := mustCall(t, op, api.VaultVerbList, api.VaultCallerOperator, api.VaultRequest{Owner: "shop"}, nil); len(meta) != 1 {
		t.Fatalf("a mint refused for its missing xkey wrote something: %+v", meta)
	}
}

// TestVault_BarrierAtRest: the bucket holds each secret, and a module's kept seed, only
// encrypted under the barrier key: the raw value holds no secret; a vault with another
// barrier key cannot open it; a ciphertext moved to another name does not open; the events
// name the secret and never its value.
func TestVault_BarrierAtRest(t *testing.T) {
	b := newBed(t, nil, 0)
	op := b.operator(t)
	given := "the-quick-brown-fox-jumps"
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req := api.VaultRequest{Owner: "shop", Name: "api-key"}
	if err := vault.Give(ctx, op, api.VaultCallerOperator, &req, []byte(given)); err != nil {
		t.Fatal(err)
	}
	mustCall(t, op, api.VaultVerbMint, api.VaultCallerOperator, req, &api.Secret{})
	var id api.Identity
	mustCall(t, op, api.VaultVerbIdentity, api.VaultCallerOperator, api.VaultRequest{Owner: "shop"}, &id)
	if !strings.HasPrefix(id.Seed, "SU") || !nkeys.IsValidPublicUserKey(id.PublicKey) {
		t.Fatalf("minted identity %+v", id)
	}

	for key, secret := range map[string]string{"secret.shop.api-key": given, "secret.shop." + vault.SeedName: id.Seed} {
		raw := b.raw(t, key)
		// The secret as such, or base64 of it as JSON encodes bytes (a prefix of whole
		// 3-byte groups: what shows whatever follows it).
		whole := []byte(secret)[:len(secret)/3*3]
		for _, form := range []string{secret, base64.StdEncoding.EncodeToString(whole), base64.RawURLEncoding.EncodeToString(whole)} {
			if bytes.Contains(raw, []byte(form)) {
				t.Fatalf("the bucket's %s holds the secret: %s", key, raw)
			}
		}
	}
	if meta := mustCall(t, op, api.VaultVerbList, api.VaultCallerOperator, api.VaultRequest{Owner: "shop"}, nil); len(meta) != 1 {
		t.Fatalf("list shows the kept seed: %+v", meta)
	}

	// A vault with another barrier key reads the same record and cannot open it.
	other := make([]byte, 32)
	rand.Read(other)
	b.vault.Stop()
	stranger := b.open(t, other, 0)
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	_, err := call(t, op, api.VaultVerbFetch, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: "api-key"}, &api.Secret{})
	refused(t, "a fetch under another barrier key", err, "does not open under this barrier key")
	stranger.Stop()
	if err := b.vault.Start(); err != nil {
		t.Fatal(err)
	}

	// The ciphertext moved to another name: the name is bound into it.
	var rec map[string]any
	if err := json.Unmarshal(b.raw(t, "secret.shop.api-key"), &rec); err != nil {
		t.Fatal(err)
	}
	rec["owner"], rec["outbox"] = "billing", nil
	moved, _ := json.Marshal(rec)
	kv, _ := b.js.KeyValue(ctx, vault.Bucket)
	if _, err := kv.Put(ctx, "secret.billing.api-key", moved); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, wait, func() error {
		_, err := call(t, op, api.VaultVerbFetch, api.VaultCallerOperator, api.VaultRequest{Owner: "billing", Name: "api-key"}, &api.Secret{})
		if err == nil || !strings.Contains(err.Error(), "does not open under this barrier key") {
			return fmt.Errorf("a ciphertext moved to billing: %v", err)
		}
		return nil
	})

	// The events: minted, identity-minted; never a value or a seed.
	events, err := b.js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, wait, func() error {
		for _, action := range []string{"minted", "identity-minted"} {
			m, err := events.GetLastMsgForSubject(ctx, api.VaultEventSubject(action))
			if err != nil {
				return fmt.Errorf("no %s event: %v", action, err)
			}
			for _, secret := range []string{given, id.Seed} {
				if bytes.Contains(m.Data, []byte(secret)) {
					t.Fatalf("the %s event holds a secret: %s", action, m.Data)
				}
			}
		}
		return nil
	})
}

// TestVault_ModuleFetch: a module fetches its own declared secrets, into its own inbox
// only, and nothing else.
func TestVault_ModuleFetch(t *testing.T) {
	b := newBed(t, nil, 0)
	op := b.operator(t)
	var minted api.Secret
	mustCall(t, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: "db-password"}, &minted)
	mustCall(t, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "billing", Name: "stripe-key"}, &api.Secret{})
	shop := b.module(t, "shop")
	caller := api.VaultModuleCaller("shop")

	var got api.Secret
	// The owner is the caller's, whatever the request says.
	mustCall(t, shop, api.VaultVerbFetch, caller, api.VaultRequest{Owner: "billing", Name: "db-password"}, &got)
	if got.Value != minted.Value || got.Owner != "shop" {
		t.Fatalf("shop fetched %+v", got)
	}
	_, err := call(t, shop, api.VaultVerbFetch, caller, api.VaultRequest{Name: "stripe-key"}, &got)
	refused(t, "a fetch of a secret shop does not declare", err, "does not declare secret", "add it to secrets: in its manifest and re-register")
	_, err = call(t, shop, api.VaultVerbFetch, caller, api.VaultRequest{Name: "api-key"}, &got)
	refused(t, "a fetch of a declared secret never minted", err, "meshnode vault mint api-key --owner shop")
	_, err = call(t, shop, api.VaultVerbMint, caller, api.VaultRequest{Owner: "shop", Name: "db-password"}, &got)
	refused(t, "a module's mint", err, "may only fetch its own secrets")
	_, err = call(t, b.module(t, "ghost"), api.VaultVerbFetch, api.VaultModuleCaller("ghost"), api.VaultRequest{Name: "db-password"}, &got)
	refused(t, "an unregistered module's fetch", err, "does not declare")

	// A reply into another identity's inbox is not answered (an answer takes milliseconds).
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	body, _ := json.Marshal(api.VaultRequest{XKey: xpub, Name: "db-password"})
	billing := b.module(t, "billing")
	sub, err := billing.SubscribeSync(manifest.InboxPrefix("billing") + ".stolen")
	if err != nil {
		t.Fatal(err)
	}
	if err := shop.PublishRequest(api.VaultToolSubject(api.VaultVerbFetch, caller), manifest.InboxPrefix("billing")+".stolen", body); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsgWithContext(ctx); err == nil {
		t.Fatalf("the vault answered into billing's inbox: %s", m.Data)
	}
}

// TestVault_RateLimit: a module past its rate is told to slow down once, then dropped; the
// operator is not limited.
func TestVault_RateLimit(t *testing.T) {
	const limit = 1 // a second, with bursts of 2
	b := newBed(t, nil, limit)
	op := b.operator(t)
	mustCall(t, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: "db-password"}, &api.Secret{})
	mustCall(t, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "billing", Name: "stripe-key"}, &api.Secret{})
	for range 10 {
		mustCall(t, op, api.VaultVerbList, api.VaultCallerOperator, api.VaultRequest{}, nil)
	}
	shop := b.module(t, "shop")
	var err error
	for i := 0; i < 2*limit+1; i++ {
		if _, err = call(t, shop, api.VaultVerbFetch, api.VaultModuleCaller("shop"), api.VaultRequest{Name: "db-password"}, &api.Secret{}); err != nil {
			break
		}
	}
	refused(t, "past the rate", err, "too many vault requests", "slow down and retry")
	// The next is dropped without an answer: a flood costs no replies.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := vault.Call(ctx, shop, api.VaultVerbFetch, api.VaultModuleCaller("shop"), api.VaultRequest{Name: "db-password"}, &api.Secret{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second request past the rate: %v, want no answer", err)
	}
	testbed.RetryUntil(t, wait, func() error {
		if got := b.limited.Load(); got < 2 {
			return fmt.Errorf("RateLimited was told %d requests, want 2", got)
		}
		return nil
	})
	// Another module has its own budget.
	mustCall(t, b.module(t, "billing"), api.VaultVerbFetch, api.VaultModuleCaller("billing"), api.VaultRequest{Name: "stripe-key"}, nil)
}

// TestVault_Enrolment: a join token enrols as many nodes as it has uses, each under a name
// not taken, and the enrolment opens with the joining node's xkey only; every refusal says
// what to do.
func TestVault_Enrolment(t *testing.T) {
	b := newBed(t, nil, 0)
	op := b.operator(t)
	var tok api.Token
	mustCall(t, op, api.VaultVerbToken, api.VaultCallerOperator, api.VaultRequest{Uses: 2, TTL: "1h"}, &tok)
	bearer, err := vault.ParseToken(tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	if bearer.MeshID != meshID || bearer.ID != tok.ID || bearer.Expect != 3 || !slices.Equal(bearer.Addrs, []string{b.srv.ClientURL()}) {
		t.Fatalf("the token's bearer %+v", bearer)
	}
	kp, _ := nkeys.FromSeed([]byte(bearer.Seed))
	pub, _ := kp.PublicKey()
	if id, ok := b.vault.TokenID(pub); !ok || id != tok.ID {
		t.Fatalf("TokenID(the token's key) = %q, %v", id, ok)
	}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	enrol := func(node string) (*api.Enrolment, error) {
		xkp, _ := nkeys.CreateCurveKeys()
		return vault.Enrol(ctx, tok.Token, node, xkp)
	}
	_, err = enrol("n1")
	refused(t, "an enrol under a server's name", err, "server named n1 already", "another --name")
	e, err := enrol("n2")
	if err != nil {
		t.Fatal(err)
	}
	if e.MeshID != meshID || !bytes.Equal(e.BarrierKey, b.barrier) || e.Expect != 3 {
		t.Fatalf("enrolment %+v", e)
	}
	_, err = enrol("n2")
	refused(t, "a second node named n2", err, "a node named n2 enrolled with join token", "another --name")
	if _, err := enrol("n3"); err != nil {
		t.Fatal(err)
	}
	_, err = enrol("n4")
	refused(t, "a used-up token", err, "used up (2 of 2 uses, by n2, n3)", "meshnode token create")
	if _, ok := b.vault.TokenID(pub); ok {
		t.Fatal("a used-up token still authenticates")
	}

	// Expired.
	var short api.Token
	mustCall(t, op, api.VaultVerbToken, api.VaultCallerOperator, api.VaultRequest{TTL: "50ms"}, &short)
	testbed.RetryUntil(t, wait, func() error {
		if time.Now().Before(short.Expires) {
			return errors.New("not expired yet")
		}
		return nil
	})
	xkp, _ := nkeys.CreateCurveKeys()
	_, err = vault.Enrol(ctx, short.Token, "n5", xkp)
	refused(t, "an expired token", err, "expired at", "meshnode token create")

	_, err = call(t, op, api.VaultVerbToken, api.VaultCallerOperator, api.VaultRequest{TTL: "-1h"}, &short)
	refused(t, "a negative ttl", err, "not a positive duration")
	if _, err := vault.ParseToken("MNJ2.xyz"); err == nil || !strings.Contains(err.Error(), "meshnode token create") {
		t.Fatalf("ParseToken of a foreign string: %v", err)
	}
	if _, err := vault.ParseToken(vault.TokenPrefix + "!!"); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("ParseToken of a damaged token: %v", err)
	}
}

// TestVault_ServerCredentials: the vault's own credentials go to a server of the mesh, sealed
// to its recorded xkey only.
func TestVault_ServerCredentials(t *testing.T) {
	b := newBed(t, nil, 0)
	op := b.operator(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var secrets api.ServerSecrets
	req := api.VaultRequest{XKey: b.node.xpub, Node: b.node.name}
	if _, err := vault.CallWith(ctx, op, b.node.xkp, api.VaultVerbServer, api.VaultCallerNode, req, &secrets); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(secrets.BarrierKey, b.barrier) || len(secrets.VaultSeed) == 0 {
		t.Fatalf("the server's secrets: %+v", secrets)
	}
	stranger, _ := nkeys.CreateCurveKeys()
	strangerPub, _ := stranger.PublicKey()
	_, err := vault.CallWith(ctx, op, stranger, api.VaultVerbServer, api.VaultCallerNode, api.VaultRequest{XKey: strangerPub, Node: b.node.name}, &secrets)
	refused(t, "the server's credentials to another xkey", err, "not the recorded xkey of server")
	_, err = vault.CallWith(ctx, op, b.node.xkp, api.VaultVerbServer, api.VaultCallerOperator, req, &secrets)
	refused(t, "the server's credentials to the operator", err, "only a server of the mesh")
}

// TestVault_BadRecord: a record that is no secret is listed by Bad and no secret; a mint of
// that name replaces it.
func TestVault_BadRecord(t *testing.T) {
	b := newBed(t, nil, 0)
	op := b.operator(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kv, err := b.js.KeyValue(ctx, vault.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "secret.shop.db-password", []byte(`{"owner":"shop","name":"db-password","versions":[]}`)); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, wait, func() error {
		if got := b.vault.Bad(); !slices.Equal(got, []string{"secret.shop.db-password"}) {
			return fmt.Errorf("Bad() = %v", got)
		}
		return nil
	})
	_, err = call(t, op, api.VaultVerbFetch, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: "db-password"}, &api.Secret{})
	refused(t, "a fetch of a bad record", err, "does not exist")
	mustCall(t, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: "db-password"}, &api.Secret{})
	if got := b.vault.Bad(); len(got) != 0 {
		t.Fatalf("after the mint Bad() = %v", got)
	}
}

// TestVault_StopClose: a stopped vault answers nothing (a caller is told no vault answers);
// Start serves again; Close ends everything it started.
func TestVault_StopClose(t *testing.T) {
	b := newBed(t, nil, 0)
	op := b.operator(t)
	b.vault.Stop()
	b.vault.Stop() // twice is no error
	// Stop does not wait for the server to drop the subscription: polled.
	testbed.RetryUntil(t, wait, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := vault.Call(ctx, op, api.VaultVerbList, api.VaultCallerOperator, api.VaultRequest{}, nil)
		if err == nil || !strings.Contains(err.Error(), "no vault answers") || !strings.Contains(err.Error(), "meshnode status") {
			return fmt.Errorf("a call to a stopped vault: %v", err)
		}
		return nil
	})
	if err := b.vault.Start(); err != nil {
		t.Fatal(err)
	}
	mustCall(t, op, api.VaultVerbList, api.VaultCallerOperator, api.VaultRequest{}, nil)
	testbed.RetryUntil(t, wait, func() error { // told after the reply is sent
		if b.served.Load() == 0 {
			return errors.New("Served was not told of an answered request")
		}
		return nil
	})
}

// TestVault_StartAfterCloseIsRefused: a node's seat runner can win mesh-vault while the node
// closes, after the vault's Close; Start then refuses, and starts no outbox sweeper that
// nothing would stop (the integration tier's goleak found one).
func TestVault_StartAfterCloseIsRefused(t *testing.T) {
	b := newBed(t, nil, 0)
	if err := b.vault.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.vault.Start(); !errors.Is(err, vault.ErrClosed) {
		t.Fatalf("Start after Close: %v, want vault.ErrClosed", err)
	}
}
