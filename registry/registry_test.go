package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/registry"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// wait bounds every poll of a mirror: a change reaches it in milliseconds on an idle machine.
const wait = 10 * time.Second

// Manifests of the tests: shop emits what billing consumes; mailer declares the mailer seat,
// which billing uses.
const (
	shopYAML    = "module: shop\nrequires: [mesh-bus]\nemits: [cart.checked-out]\n"
	billingYAML = "module: billing\nrequires: [mesh-bus]\nconsumes: [shop.cart.checked-out]\nuses: [mailer]\n"
	mailerYAML  = "module: mailer\nrequires: [mesh-bus]\nseats:\n  mailer:\n    scope: mesh\n    retain: 1d\n    accepts: [send]\n    emits: [sent]\n"
	auditorYAML = "module: auditor\nrequires: [mesh-bus]\nconsumes: [\"**\"]\n"
)

// changes records what a registry's change hook was told, in order.
type changes struct {
	mu  sync.Mutex
	got []string // "+name", "~name", "-name": added, replaced, removed
}

func (c *changes) hook(old, new *registry.Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case old == nil:
		c.got = append(c.got, "+"+new.Module)
	case new == nil:
		c.got = append(c.got, "-"+old.Module)
	default:
		c.got = append(c.got, "~"+new.Module)
	}
}

func (c *changes) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// bed is one embedded JetStream server the tests' registries share.
type bed struct {
	srv *server.Server
}

func newBed(t *testing.T) *bed {
	t.Helper()
	return &bed{srv: testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})}
}

// open opens a registry of its own connection on the bed, following the bucket until the
// test ends.
func (b *bed) open(t *testing.T, onChange registry.ChangeFunc) *registry.Registry {
	t.Helper()
	_, js := testbed.Connect(t, b.srv)
	r := registry.New(nil, onChange)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := r.Open(ctx, js, 1, 0); err != nil {
		t.Fatal(err)
	}
	run, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(run) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// kv is the registry's bucket, for writes the registry does not make itself.
func (b *bed) kv(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, js := testbed.Connect(t, b.srv)
	kv, err := js.KeyValue(context.Background(), registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func userKey(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	return pub
}

func record(t *testing.T, yaml string) registry.Record {
	t.Helper()
	m, err := manifest.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	return registry.Record{Module: m.Module, Manifest: yaml, PublicKey: userKey(t), Registered: now, Updated: now}
}

func put(t *testing.T, r *registry.Registry, rec registry.Record, revision uint64) *registry.Entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	e, err := r.Put(ctx, rec, revision)
	if err != nil {
		t.Fatalf("Put %s at %d: %v", rec.Module, revision, err)
	}
	return e
}

func names(es []*registry.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Module)
	}
	return out
}

// TestRegistry_PutReplaceDelete: a write returns once this registry's mirror holds it,
// parsed; a write against the wrong revision is a conflict; a replacement moves the module's
// key; a delete leaves nothing; the change hook is told each, before the write returns.
func TestRegistry_PutReplaceDelete(t *testing.T) {
	b := newBed(t)
	var seen changes
	r := b.open(t, seen.hook)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	shop := record(t, shopYAML)
	e := put(t, r, shop, 0)
	if e == nil || e.Module != "shop" || e.Revision == 0 || e.Manifest == nil || e.Derivation == nil {
		t.Fatalf("Put returned %+v, want shop parsed at its revision", e)
	}
	if got, ok := r.Get("shop"); !ok || got != e {
		t.Fatalf("Get(shop) = %v, %v; want the entry Put returned", got, ok)
	}
	if got, ok := r.ByKey(shop.PublicKey); !ok || got.Module != "shop" {
		t.Fatalf("ByKey(shop's key) = %v, %v", got, ok)
	}
	if got, want := r.Revision(), e.Revision; got < want {
		t.Fatalf("Revision() = %d, want at least %d", got, want)
	}
	if got := seen.list(); !slices.Equal(got, []string{"+shop"}) {
		t.Fatalf("the hook saw %v when Put returned, want [+shop]", got)
	}

	if _, err := r.Put(ctx, shop, 0); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("a second create of shop: %v, want ErrConflict", err)
	}
	if _, err := r.Put(ctx, shop, e.Revision+100); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("a replace at a revision shop never had: %v, want ErrConflict", err)
	}

	rotated := shop
	rotated.PublicKey = userKey(t)
	e2 := put(t, r, rotated, e.Revision)
	if e2.Revision <= e.Revision || e2.PublicKey != rotated.PublicKey {
		t.Fatalf("the replacement is %+v, want a later revision with the new key", e2)
	}
	if _, ok := r.ByKey(shop.PublicKey); ok {
		t.Fatal("the old key still names shop after its replacement")
	}
	if got, ok := r.ByKey(rotated.PublicKey); !ok || got != e2 {
		t.Fatal("the new key does not name shop")
	}
	if _, err := r.Put(ctx, shop, e.Revision); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("a replace at the old revision: %v, want ErrConflict", err)
	}

	put(t, r, record(t, billingYAML), 0)
	if got, want := names(r.List()), []string{"billing", "shop"}; !slices.Equal(got, want) {
		t.Fatalf("List() = %v, want %v", got, want)
	}
	if got := r.Catalogue("shop"); len(got) != 1 || got[0].Module != "billing" {
		t.Fatalf("Catalogue(skip shop) = %v, want billing's manifest", got)
	}

	if err := r.Delete(ctx, "shop", e.Revision); err == nil {
		t.Fatal("a delete at an old revision succeeded")
	}
	if err := r.Delete(ctx, "shop", e2.Revision); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Get("shop"); ok {
		t.Fatal("shop is still registered after Delete returned")
	}
	if _, ok := r.ByKey(rotated.PublicKey); ok {
		t.Fatal("shop's key still names a module after Delete returned")
	}
	if got, want := seen.list(), []string{"+shop", "~shop", "+billing", "-shop"}; !slices.Equal(got, want) {
		t.Fatalf("the hook saw %v, want %v", got, want)
	}
	// A new module of the same name is a create again.
	put(t, r, record(t, shopYAML), 0)
}

// TestRegistry_Mirror: a registry opened on a bucket with records holds them all when Open
// returns; another registry's writes reach it through the watch, and its hook.
func TestRegistry_Mirror(t *testing.T) {
	b := newBed(t)
	writer := b.open(t, nil)
	shop := put(t, writer, record(t, shopYAML), 0)
	put(t, writer, record(t, mailerYAML), 0)

	var seen changes
	reader := b.open(t, seen.hook)
	if got, want := names(reader.List()), []string{"mailer", "shop"}; !slices.Equal(got, want) {
		t.Fatalf("after Open the mirror holds %v, want %v", got, want)
	}
	if got, want := seen.list(), []string{"+shop", "+mailer"}; !slices.Equal(got, want) {
		t.Fatalf("the hook saw %v while loading, want %v", got, want)
	}

	billing := put(t, writer, record(t, billingYAML), 0)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := writer.Delete(ctx, "shop", shop.Revision); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, wait, func() error {
		if got, want := seen.list(), []string{"+shop", "+mailer", "+billing", "-shop"}; !slices.Equal(got, want) {
			return fmt.Errorf("the reader's hook saw %v, want %v", got, want)
		}
		return nil
	})
	if got, ok := reader.Get("billing"); !ok || got.Revision != billing.Revision || got.PublicKey != billing.PublicKey {
		t.Fatalf("the reader holds billing as %+v, want revision %d", got, billing.Revision)
	}
	if _, ok := reader.Get("shop"); ok {
		t.Fatal("the reader still holds the deleted shop")
	}
	if got, want := reader.Revision(), writer.Revision(); got != want {
		t.Fatalf("the reader is at revision %d, the writer at %d", got, want)
	}
}

// TestRegistry_Identities: the operator's, the vault's and the servers' keys are recorded
// for every node; a value that is no key is refused and the previous good one stays.
func TestRegistry_Identities(t *testing.T) {
	b := newBed(t)
	writer, reader := b.open(t, nil), b.open(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if got := writer.Nodes(); got == nil || len(got) != 0 {
		t.Fatalf("Nodes() of an empty registry = %#v, want empty and not nil", got)
	}
	if writer.Operator() != "" || writer.Vault() != "" {
		t.Fatal("an empty registry names an operator or a vault")
	}

	operator, vaultKey := userKey(t), userKey(t)
	server := func() registry.NodeIdentity {
		kp, _ := nkeys.CreateServer()
		xkp, _ := nkeys.CreateCurveKeys()
		pub, _ := kp.PublicKey()
		xpub, _ := xkp.PublicKey()
		return registry.NodeIdentity{PublicKey: pub, XKey: xpub}
	}
	n1, n2 := server(), server()
	for _, err := range []error{
		writer.SetOperator(ctx, operator),
		writer.SetVault(ctx, vaultKey),
		writer.SetNode(ctx, "n2", n2),
		writer.SetNode(ctx, "n1", n1),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The writer holds them at once; the reader once its watch sees them.
	for name, r := range map[string]*registry.Registry{"writer": writer, "reader": reader} {
		testbed.RetryUntil(t, wait, func() error {
			id, ok := r.Node("n1")
			if r.Operator() != operator || r.Vault() != vaultKey || !ok || id != n1 || !slices.Equal(r.Nodes(), []string{"n1", "n2"}) {
				return fmt.Errorf("%s: operator %q vault %q nodes %v n1 %+v", name, r.Operator(), r.Vault(), r.Nodes(), id)
			}
			return nil
		})
	}

	if err := writer.RemoveNode(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, wait, func() error {
		if _, ok := reader.Node("n2"); ok {
			return errors.New("the reader still knows removed node n2")
		}
		return nil
	})

	// Values that are no keys: the last good one stays in force on every node.
	kv := b.kv(t)
	for key, bad := range map[string]string{
		"identity.operator": "not-a-key",
		"identity.vault":    n1.PublicKey, // a server's key is no user key
		"identity.node.n1":  `{"public_key":"` + operator + `","xkey":"` + n1.XKey + `"}`,
	} {
		if _, err := kv.Put(ctx, key, []byte(bad)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx, "identity.node.n3", []byte("{")); err != nil {
		t.Fatal(err)
	}
	n4 := server()
	if err := writer.SetNode(ctx, "n4", n4); err != nil { // a marker: the reader has seen the bad ones once it has this
		t.Fatal(err)
	}
	testbed.RetryUntil(t, wait, func() error {
		if _, ok := reader.Node("n4"); !ok {
			return errors.New("the reader has not seen n4 yet")
		}
		return nil
	})
	if got := reader.Operator(); got != operator {
		t.Errorf("after a bad operator record the reader names %q, want the previous %q", got, operator)
	}
	if got := reader.Vault(); got != vaultKey {
		t.Errorf("after a bad vault record the reader names %q, want the previous %q", got, vaultKey)
	}
	if got, _ := reader.Node("n1"); got != n1 {
		t.Errorf("after a bad record of n1 the reader holds %+v, want the previous %+v", got, n1)
	}
	if _, ok := reader.Node("n3"); ok {
		t.Error("a node whose only record is bad is known")
	}
	// A fresh mirror, loading the same bucket, comes to the same answers.
	fresh := b.open(t, nil)
	if fresh.Operator() != operator || fresh.Vault() != vaultKey || !slices.Equal(fresh.Nodes(), []string{"n1", "n4"}) {
		t.Errorf("a fresh mirror: operator %q vault %q nodes %v", fresh.Operator(), fresh.Vault(), fresh.Nodes())
	}
}

// TestRegistry_Declarers: the module that declares a seat is its declarer until it is
// removed; the mesh's own seats are declared by the built-in manifest; a user of the seat is
// bound to the protocol it registered against; Signers hands a consumer its sources' keys.
func TestRegistry_Declarers(t *testing.T) {
	b := newBed(t)
	r := b.open(t, nil)
	if _, ok := r.Declarer("mailer"); ok {
		t.Fatal("an empty registry has a declarer of mailer")
	}
	if got := r.Seat("mailer"); got.Seat != "mailer" || got.Scope != "" {
		t.Fatalf("Seat(mailer) before anyone declares it = %+v, want the name only", got)
	}
	if _, ok := r.DeclaredSeat(manifest.VaultSeat); !ok {
		t.Fatalf("the built-in %s is not declared", manifest.VaultSeat)
	}

	mailer := put(t, r, record(t, mailerYAML), 0)
	if got, ok := r.Declarer("mailer"); !ok || got != mailer {
		t.Fatalf("Declarer(mailer) = %v, %v; want module mailer", got, ok)
	}
	if got := r.Seat("mailer"); got.Scope != manifest.ScopeMesh || !slices.Equal(got.Accepts, []string{"send"}) || !slices.Equal(got.Emits, []string{"sent"}) {
		t.Fatalf("Seat(mailer) = %+v, want mesh scope accepting send", got)
	}

	shop := put(t, r, record(t, shopYAML), 0)
	billing := put(t, r, record(t, billingYAML), 0)
	bindings := r.Bindings("mailer", "")
	if len(bindings) != 1 || bindings[0].Module != "billing" || !bindings[0].Uses {
		t.Fatalf("Bindings(mailer) = %+v, want billing as its user", bindings)
	}
	if got := r.Bindings("mailer", "billing"); len(got) != 0 {
		t.Fatalf("Bindings(mailer, skip billing) = %+v, want none", got)
	}
	if got := r.SeatAt(billing, "mailer"); got.Scope != manifest.ScopeMesh {
		t.Fatalf("SeatAt(billing, mailer) = %+v", got)
	}

	signers := r.Signers(billing.Manifest)
	if got := signers[api.SignerKey(api.SignerModule, "shop")]; got != shop.PublicKey {
		t.Fatalf("billing's signers %v: shop, whose event it consumes, is missing", signers)
	}
	if _, ok := signers[api.SignerKey(api.SignerModule, "mailer")]; ok {
		t.Fatalf("billing's signers %v name mailer, whose events it does not consume", signers)
	}
	if got := r.Signers(mailer.Manifest)[api.SignerKey(api.SignerJob, "billing")]; got != billing.PublicKey {
		t.Fatalf("mailer's signers do not name billing, which submits jobs to its seat")
	}
	// "**" reaches the servers' and the vault's events too.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	vaultKey := userKey(t)
	if err := r.SetVault(ctx, vaultKey); err != nil {
		t.Fatal(err)
	}
	auditor := put(t, r, record(t, auditorYAML), 0)
	if got := r.Signers(auditor.Manifest)[api.SignerKey(api.SignerSeat, manifest.VaultSeat)]; got != vaultKey {
		t.Fatalf("a consumer of ** is not handed the vault's key: %v", r.Signers(auditor.Manifest))
	}

	if err := r.Delete(ctx, "mailer", 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Declarer("mailer"); ok {
		t.Fatal("the removed mailer still declares its seat")
	}
}

// TestRegistry_BadRecords: a module record that does not decode, names another key, or
// claims another module's key is refused and listed by Bad; the previous good revision
// stays in force; a write of the module replaces the bad record.
func TestRegistry_BadRecords(t *testing.T) {
	b := newBed(t)
	r := b.open(t, nil)
	kv := b.kv(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	mark := func() { // once r holds a marker module written after the bad records, it has seen them
		t.Helper()
		rev, err := kv.Put(ctx, "marker", []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		testbed.RetryUntil(t, wait, func() error {
			if r.Revision() < rev {
				return fmt.Errorf("the mirror is at %d, the marker at %d", r.Revision(), rev)
			}
			return nil
		})
	}

	shop := put(t, r, record(t, shopYAML), 0)
	stolen := record(t, billingYAML)
	stolen.PublicKey = shop.PublicKey
	bads := map[string][]byte{
		"module.shop":    []byte("{not json"),
		"module.ghost":   []byte(`{"module":"other"}`),
		"module.billing": mustJSON(t, stolen),
		"module.mailer":  mustJSON(t, registry.Record{Module: "mailer", Manifest: mailerYAML, PublicKey: "UNOTAKEY"}),
	}
	for key, v := range bads {
		if _, err := kv.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	mark()
	if got, want := r.Bad(), []string{"module.billing", "module.ghost", "module.mailer", "module.shop"}; !slices.Equal(got, want) {
		t.Fatalf("Bad() = %v, want %v", got, want)
	}
	// The previous good record stays, at the bad record's revision: the one a replace names.
	if got, ok := r.Get("shop"); !ok || got.PublicKey != shop.PublicKey || got.Revision <= shop.Revision {
		t.Fatalf("after a bad record of shop the mirror holds %+v, %v; want the previous good record at the bad one's revision", got, ok)
	}
	if got, ok := r.ByKey(shop.PublicKey); !ok || got.Module != "shop" {
		t.Fatalf("billing's record claiming shop's key took it: ByKey = %+v", got)
	}
	for _, name := range []string{"billing", "ghost", "mailer"} {
		if _, ok := r.Get(name); ok {
			t.Errorf("module %s, whose only record is bad, is registered", name)
		}
	}

	// A write of the module replaces the bad record, as a create would.
	put(t, r, record(t, billingYAML), 0)
	if got, want := r.Bad(), []string{"module.ghost", "module.mailer", "module.shop"}; !slices.Equal(got, want) {
		t.Fatalf("after billing's write Bad() = %v, want %v", got, want)
	}
	// Also over a bad record that hides a good revision: the caller read that one.
	fixed := put(t, r, record(t, shopYAML), 0)
	if fixed.Revision <= shop.Revision {
		t.Fatalf("shop rewritten at %d, not after %d", fixed.Revision, shop.Revision)
	}
}

// TestRegistry_Leaving: a record marked Removed is gone to the mirror at once and waits,
// with its event, as Leaving and Pending; Delete ends it.
func TestRegistry_Leaving(t *testing.T) {
	b := newBed(t)
	r := b.open(t, nil)
	ev, err := outbox.New(registry.EventRegistered, "n1", map[string]any{"module": "shop"})
	if err != nil {
		t.Fatal(err)
	}
	rec := record(t, shopYAML)
	rec.Outbox = []outbox.Event{ev}
	e := put(t, r, rec, 0)
	if got := r.Pending(); len(got) != 1 || got[0].Module != "shop" {
		t.Fatalf("Pending() = %v, want shop with its registered event", names(got))
	}

	removed := e.Record
	ev.Action = registry.EventRemoved
	removed.Outbox, removed.Removed = []outbox.Event{ev}, true
	put(t, r, removed, e.Revision)
	if _, ok := r.Get("shop"); ok {
		t.Fatal("a removed module is still registered")
	}
	if _, ok := r.ByKey(rec.PublicKey); ok {
		t.Fatal("a removed module's key still names it")
	}
	if got, ok := r.Leaving("shop"); !ok || len(got.Outbox) != 1 || got.Outbox[0].Action != registry.EventRemoved {
		t.Fatalf("Leaving(shop) = %+v, %v; want its removed event", got, ok)
	}
	if got := r.Pending(); len(got) != 1 || !got[0].Removed {
		t.Fatalf("Pending() = %v, want the leaving shop", names(got))
	}
	if got := r.Bad(); len(got) != 0 {
		t.Fatalf("a leaving record is listed bad: %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := r.Delete(ctx, "shop", 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Leaving("shop"); ok || len(r.Pending()) != 0 {
		t.Fatal("the deleted record still waits")
	}

	// An outbox event that is not one of the registry's is refused with the record.
	bad := record(t, billingYAML)
	bad.Outbox = []outbox.Event{{ID: ev.ID, Action: "module.exploded", Body: ev.Body}}
	kv := b.kv(t)
	rev, err := kv.Put(ctx, "module.billing", mustJSON(t, bad))
	if err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, wait, func() error {
		if r.Revision() < rev {
			return fmt.Errorf("the mirror is at %d, the write at %d", r.Revision(), rev)
		}
		return nil
	})
	if _, ok := r.Get("billing"); ok || !slices.Equal(r.Bad(), []string{"module.billing"}) {
		t.Fatalf("a record with an unknown event: registered %v, Bad() = %v", ok, r.Bad())
	}
}

// TestRegistry_Close: a closed registry follows the bucket no more and keeps its last state;
// Close of one never opened is no error.
func TestRegistry_Close(t *testing.T) {
	if err := registry.New(nil, nil).Close(); err != nil {
		t.Fatalf("Close of an unopened registry: %v", err)
	}
	b := newBed(t)
	writer, live := b.open(t, nil), b.open(t, nil)
	put(t, writer, record(t, shopYAML), 0)

	_, js := testbed.Connect(t, b.srv)
	var seen changes
	r := registry.New(nil, seen.hook)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := r.Open(ctx, js, 1, 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	select { // the watch's end ends Run, which tells it apart from a stop it was asked for
	case err := <-done:
		if err == nil {
			t.Fatal("Run ended without an error after Close, as if its context had ended")
		}
	case <-time.After(wait):
		t.Fatal("Run did not end after Close")
	}
	put(t, writer, record(t, billingYAML), 0)
	// A live registry opened beside it sees the write: the closed one had the same chance.
	testbed.RetryUntil(t, wait, func() error {
		if _, ok := live.Get("billing"); !ok {
			return errors.New("the live registry has not seen billing yet")
		}
		return nil
	})
	if _, ok := r.Get("billing"); ok {
		t.Fatal("a closed registry followed a write")
	}
	if _, ok := r.Get("shop"); !ok {
		t.Fatal("a closed registry lost its last state")
	}
	if got := seen.list(); !slices.Equal(got, []string{"+shop"}) {
		t.Fatalf("the closed registry's hook saw %v", got)
	}
}

// TestRegistry_OpenBoundsBucket: Open makes the bucket as asked (history, bound), and a
// second Open of an existing bucket keeps it.
func TestRegistry_OpenBoundsBucket(t *testing.T) {
	b := newBed(t)
	_, js := testbed.Connect(t, b.srv)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	r := registry.New(nil, nil)
	if err := r.Open(ctx, js, 1, 1<<20); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	kv, err := js.KeyValue(ctx, registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.History(); got < 5 {
		t.Fatalf("the bucket keeps %d revisions of a record, want at least 5 (DESIGN §3)", got)
	}
	if got := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.MaxBytes; got != 1<<20 {
		t.Fatalf("the bucket is bounded at %d bytes, want %d", got, 1<<20)
	}
	again := registry.New(nil, nil)
	if err := again.Open(ctx, js, 1, 1<<20); err != nil {
		t.Fatalf("a second Open of the bucket: %v", err)
	}
	again.Close()
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRegistry_SignersFollowTheRegistry: Signers' sources are looked up by emitter (an index
// built once per change), so a consumer named for an emitter gets that emitter's key and no
// other's, a wildcard emitter every one's, and an emitter registered later once it is.
func TestRegistry_SignersFollowTheRegistry(t *testing.T) {
	b := newBed(t)
	r := b.open(t, nil)
	named := put(t, r, record(t, "module: named\nrequires: [mesh-bus]\nconsumes: [late.thing.done]\n"), 0)
	anyone := put(t, r, record(t, "module: anyone\nrequires: [mesh-bus]\nconsumes: [\"*.thing.done\"]\n"), 0)
	early := put(t, r, record(t, "module: early\nrequires: [mesh-bus]\nemits: [thing.done]\n"), 0)
	if got := r.Signers(named.Manifest); len(got) != 0 {
		t.Fatalf("named's signers before late is registered = %v, want none (early emits the event, but named names late)", got)
	}
	if got := r.Signers(anyone.Manifest); len(got) != 1 || got[api.SignerKey(api.SignerModule, "early")] != early.PublicKey {
		t.Fatalf("anyone's signers = %v, want early's key alone", got)
	}
	late := put(t, r, record(t, "module: late\nrequires: [mesh-bus]\nemits: [thing.done]\n"), 0)
	if got := r.Signers(named.Manifest); len(got) != 1 || got[api.SignerKey(api.SignerModule, "late")] != late.PublicKey {
		t.Fatalf("named's signers once late is registered = %v, want late's key alone", got)
	}
	if got := r.Signers(anyone.Manifest); len(got) != 2 || got[api.SignerKey(api.SignerModule, "late")] != late.PublicKey {
		t.Fatalf("anyone's signers once late is registered = %v, want early's and late's keys", got)
	}
}

// TestRegistry_SiteMirror (issue 42): a site's registry is a mirror of the hub's bucket in the
// site's JetStream domain: it holds what the hub registered, follows what the hub registers
// next, and keeps its records while the site's link is down.
func TestRegistry_SiteMirror(t *testing.T) {
	leafPort := testbed.FreeAddr(t)
	_, port, _ := strings.Cut(leafPort, ":")
	lp, _ := strconv.Atoi(port)
	hub := testbed.NATSServer(t, &server.Options{ServerName: "hub", JetStream: true, StoreDir: t.TempDir(), JetStreamDomain: manifest.HubDomain,
		LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: lp}})
	u, _ := url.Parse("nats-leaf://" + leafPort)
	site := testbed.NATSServer(t, &server.Options{ServerName: "oslo", JetStream: true, StoreDir: t.TempDir(), JetStreamDomain: manifest.SiteDomain("oslo"),
		LeafNode: server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{u}}}}})
	testbed.RetryUntil(t, wait, func() error {
		if hub.NumLeafNodes() != 1 || site.NumLeafNodes() != 1 {
			return errors.New("the site is not linked yet")
		}
		return nil
	})
	// The hub's registry, whose watch the cut below ends (its Run's error is the cut's).
	_, hubJS := testbed.Connect(t, hub, nats.MaxReconnects(0))
	writer := registry.New(nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := writer.Open(ctx, hubJS, 1, 0); err != nil {
		t.Fatal(err)
	}
	wrun, wstop := context.WithCancel(context.Background())
	defer wstop()
	go writer.Run(wrun)
	defer writer.Close()
	put(t, writer, record(t, shopYAML), 0)

	_, js := testbed.Connect(t, site)
	reader := registry.New(nil, nil)
	if err := reader.OpenMirror(ctx, js, 0); err != nil {
		t.Fatal(err)
	}
	run, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reader.Run(run) }()
	defer func() {
		stop()
		<-done
		reader.Close()
	}()
	holds := func(want ...string) {
		t.Helper()
		testbed.RetryUntil(t, wait, func() error {
			if got := names(reader.List()); !slices.Equal(got, want) {
				return fmt.Errorf("the site's registry holds %v, want %v", got, want)
			}
			return nil
		})
	}
	holds("shop")
	billing := put(t, writer, record(t, billingYAML), 0)
	holds("billing", "shop")
	if got, _ := reader.Get("billing"); got.Revision != billing.Revision {
		t.Fatalf("the site holds billing at revision %d, the hub at %d", got.Revision, billing.Revision)
	}
	// Cut off (the hub stops), the site still has every module the hub had registered.
	hub.Shutdown()
	hub.WaitForShutdown()
	testbed.RetryUntil(t, wait, func() error {
		if site.NumLeafNodes() != 0 {
			return errors.New("the site is still linked")
		}
		return nil
	})
	holds("billing", "shop")
	if _, ok := reader.Get("shop"); !ok {
		t.Fatal("the site lost shop when its link went down")
	}
}
