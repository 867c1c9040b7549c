package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// TestReplayable is the rule `dead replay` applies before publishing a letter as the
// operator: only what the letter's source could have published itself.
func TestReplayable(t *testing.T) {
	keys := map[string]nkeys.KeyPair{}
	mods := []registry.ModuleInfo{}
	for name, text := range map[string]string{
		"shop":    "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\nuses: [mail]\ntools: [status]\n",
		"billing": "module: billing\nrequires: [mesh-bus]\nemits: [paid]\n",
		"mailer": "module: mailer\nrequires: [mesh-bus]\nseats:\n  mail: {scope: mesh, retain: 1h, accepts: [send], emits: [sent]}\n" +
			"  poll: {scope: node, retain: 1h, accepts: [run]}\n",
	} {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		keys[name] = kp
		mf, err := manifest.Parse([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, registry.ModuleInfo{Module: name, PublicKey: pub, Emits: mf.Emits, Uses: mf.Uses, Manifest: text})
	}
	auth := authorityOf(mods)
	for _, signer := range []string{"alpha", "mesh-vault"} { // a server's key, the vault's
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		keys[signer] = kp
		if signer == "alpha" {
			auth[nodeSigner(signer)] = replaySource{publicKey: pub}
		} else {
			auth[seatSigner(signer)] = replaySource{publicKey: pub}
		}
	}
	body := []byte(`{"order":7}`)
	// letter is a dead letter of an envelope stamped by signer as source on subject.
	letter := func(subject, source, signer string) nats.Header {
		kp := keys[signer]
		if kp == nil {
			kp, _ = nkeys.CreateUser()
		}
		h, err := envelope.Stamp(kp, source, "alpha", subject, body, envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		h.Set(envelope.DeadSubject, subject)
		h.Set(envelope.DeadReason, "max deliveries")
		return h
	}
	twoSources := letter("mesh.mod.shop.event.order.placed", "shop", "shop")
	twoSources.Add(envelope.Source, "billing")
	twoSubjects := letter("mesh.mod.shop.event.order.placed", "shop", "shop")
	twoSubjects.Add(envelope.DeadSubject, "mesh.mod.billing.event.paid")
	noSubject := letter("mesh.mod.shop.event.order.placed", "shop", "shop")
	noSubject.Del(envelope.DeadSubject)
	// A letter that names one subject while signed for another.
	moved := letter("mesh.mod.shop.event.order.placed", "shop", "shop")
	moved.Set(envelope.DeadSubject, "mesh.mod.billing.event.paid")
	for _, tc := range []struct {
		name string
		h    nats.Header
		body []byte
		ok   bool
	}{
		{"a module's declared event", letter("mesh.mod.shop.event.order.placed", "shop", "shop"), body, true},
		{"the operator's identity in the registry", letter("$KV.mesh-registry.identity.operator", "shop", "shop"), body, false},
		{"deleting EVENTS", letter("$JS.API.STREAM.DELETE.EVENTS", "shop", "shop"), body, false},
		{"a vault record", letter("$KV.mesh-vault.x", "shop", "shop"), body, false},
		{"a tool call", letter("mesh.mod.shop.tool.status", "shop", "shop"), body, false},
		{"another module's event", letter("mesh.mod.billing.event.paid", "shop", "shop"), body, false},
		{"an undeclared event", letter("mesh.mod.shop.event.order.cancelled", "shop", "shop"), body, false},
		{"a wildcard", letter("mesh.mod.shop.event.*", "shop", "shop"), body, false},
		{"a full wildcard", letter("mesh.mod.shop.event.>", "shop", "shop"), body, false},
		{"an unregistered module", letter("mesh.mod.ghost.event.x", "ghost", "ghost"), body, false},
		{"signed by another module", letter("mesh.mod.shop.event.order.placed", "shop", "billing"), body, false},
		{"a body altered after signing", letter("mesh.mod.shop.event.order.placed", "shop", "shop"), []byte(`{"order":8}`), false},
		{"a subject other than the signed one", moved, body, false},
		{"two sources", twoSources, body, false},
		{"two original subjects", twoSubjects, body, false},
		{"no original subject", noSubject, body, false},
		{"node state", letter("mesh.state.node.alpha", "alpha", ""), body, false},
		{"a dead subject", letter("mesh.dead.EVENTS.shop", "shop", "shop"), body, false},
		{"an inbox", letter("_INBOX.shop.x", "shop", "shop"), body, false},
		{"a seat's event by its declarer", letter("mesh.seat.mail.event.sent", "mailer", "mailer"), body, true},
		{"a seat's undeclared event", letter("mesh.seat.mail.event.lost", "mailer", "mailer"), body, false},
		{"a seat's event by a module that only uses it", letter("mesh.seat.mail.event.sent", "shop", "shop"), body, false},
		{"a job to a seat the source uses", letter("mesh.seat.mail.accept.send", "shop", "shop"), body, true},
		{"a job to a seat the source does not use", letter("mesh.seat.mail.accept.send", "billing", "billing"), body, false},
		{"a verb the seat does not take", letter("mesh.seat.mail.accept.burn", "shop", "shop"), body, false},
		{"a node-scoped job to a mesh-scoped seat", letter("mesh.seat.mail.node.alpha.accept.send", "shop", "shop"), body, false},
		{"a node-scoped job by the declarer", letter("mesh.seat.poll.node.alpha.accept.run", "mailer", "mailer"), body, true},
		{"a job signed by another", letter("mesh.seat.mail.accept.send", "shop", "mailer"), body, false},
		{"a node's own event", letter("mesh.node.alpha.event.joined", "alpha", "alpha"), body, true},
		{"a node's own event, signed by another key", letter("mesh.node.alpha.event.joined", "alpha", ""), body, false},
		{"an event of a node the mesh does not know", letter("mesh.node.zeta.event.joined", "zeta", ""), body, false},
		{"another node's event", letter("mesh.node.beta.event.left", "alpha", ""), body, false},
		{"the vault's event", letter("mesh.seat.mesh-vault.event.minted", "mesh-vault", "mesh-vault"), body, true},
		{"the vault's event, signed by another key", letter("mesh.seat.mesh-vault.event.minted", "mesh-vault", ""), body, false},
		{"the controller's event, which has no known signer", letter("mesh.seat.mesh-controller.event.deployed", "mesh-controller", ""), body, false},
		{"the vault's event from a module", letter("mesh.seat.mesh-vault.event.minted", "shop", "shop"), body, false},
		{"the controller's tool", letter("mesh.seat.mesh-controller.tool.register", "mesh-controller", ""), body, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := replayable(tc.h, tc.body, auth)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatalf("%s from %s would be replayed", tc.h.Get(envelope.DeadSubject), tc.h.Get(envelope.Source))
			}
		})
	}
}

// deadLs is `meshnode dead ls --json`, decoded.
func deadLs(t *testing.T, dir string) ([]deadLetter, error) {
	t.Helper()
	r := meshnode(t, nil, "dead", "ls", "--json", "--data-dir", dir)
	if r.code != 0 {
		return nil, errors.New(r.stderr)
	}
	var out []deadLetter
	for line := range strings.SplitSeq(strings.TrimSpace(r.stdout), "\n") {
		if line == "" {
			continue
		}
		var d deadLetter
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// TestBinary_DeadReplayRefusesForgery: dead letters naming the registry's operator key or
// EVENTS' delete API — written with the operator's own connection, as an attacker who got
// one into DEAD would — are refused by replay, one by one and with --all, and kept; the
// targets are untouched.
func TestBinary_DeadReplayRefusesForgery(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	shopSeed := registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	registerModule(t, dir, "module: billing\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\n")
	op, err := dialWith(p.clientURL, filepath.Join(dir, node.OperatorSeedFile))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	js, _ := jetstream.New(op)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "mesh-registry")
	if err != nil {
		t.Fatal(err)
	}
	before, err := kv.Get(ctx, "identity.operator")
	if err != nil {
		t.Fatal(err)
	}
	seed, err := os.ReadFile(shopSeed)
	if err != nil {
		t.Fatal(err)
	}
	shopKey, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		t.Fatal(err)
	}
	shopPub, _ := shopKey.PublicKey()
	targets := []string{"$KV.mesh-registry.identity.operator", "$JS.API.STREAM.DELETE.EVENTS"}
	for _, target := range targets {
		body := []byte(`{"public_key":"` + shopPub + `"}`)
		h, err := envelope.Stamp(shopKey, "shop", "alpha", target, body, envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		h.Set(envelope.DeadSubject, target)
		h.Set(envelope.DeadConsumer, "billing")
		h.Set(envelope.DeadReason, "max deliveries")
		h.Set(nats.MsgIdHdr, "forged."+target)
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.DeadSubject(manifest.EventsStreamName, "billing"), Header: h, Data: body}); err != nil {
			t.Fatal(err)
		}
	}
	letters, err := deadLs(t, dir)
	if err != nil || len(letters) != 2 {
		t.Fatalf("dead ls: %v %+v", err, letters)
	}
	for _, l := range letters {
		r := meshnode(t, nil, "dead", "replay", fmt.Sprint(l.ID), "--data-dir", dir)
		if r.code != 1 || !strings.Contains(r.stderr, "not replayed") || !strings.Contains(r.stderr, "kept") {
			t.Errorf("replay of a letter to %s: exit %d\n%s%s", l.Subject, r.code, r.stdout, r.stderr)
		}
	}
	r := meshnode(t, nil, "dead", "replay", "--all", "--data-dir", dir)
	if r.code != 1 || !strings.Contains(r.stderr, "2 of 2 dead letters refused") {
		t.Errorf("replay --all: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if after, err := deadLs(t, dir); err != nil || len(after) != 2 {
		t.Errorf("refused letters not kept: %v %+v", err, after)
	}
	after, err := kv.Get(ctx, "identity.operator")
	if err != nil || after.Revision() != before.Revision() || string(after.Value()) != string(before.Value()) {
		t.Errorf("the registry's operator identity changed: %v", err)
	}
	if _, err := js.Stream(ctx, manifest.EventsStreamName); err != nil {
		t.Errorf("EVENTS: %v", err)
	}
}

// TestBinary_DeadReplayDiesAgain: a replayed event that fails again is dead-lettered again, as
// a new letter with the same event id.
func TestBinary_DeadReplayDiesAgain(t *testing.T) {
	dir, _, id := failedOrder(t, "[order.placed]")
	first := awaitNewLetter(t, dir, 0)
	if first.EventID != id || first.Reason != "no such customer" || first.Consumer != "billing" {
		t.Fatalf("first dead letter %+v", first)
	}
	if r := meshnode(t, nil, "dead", "replay", fmt.Sprint(first.ID), "--data-dir", dir); r.code != 0 {
		t.Fatalf("dead replay: exit %d %s", r.code, r.stderr)
	}
	second := awaitNewLetter(t, dir, first.ID)
	if second.ID <= first.ID || second.EventID != id || second.Reason != "no such customer" || second.Deliveries != manifest.MaxDeliver {
		t.Fatalf("second dead letter %+v after the first %+v", second, first)
	}
	if ls, err := deadLs(t, dir); err != nil || len(ls) != 1 {
		t.Fatalf("dead ls after the second death: %v %+v (the replayed letter should be gone)", err, ls)
	}
}

// failedOrder starts a node on which shop (emitting shopEmits) places an order that billing,
// failing every time, gives up on; it returns the data dir, the node and the order's id.
// billing keeps failing until the test ends.
func failedOrder(t *testing.T, shopEmits string) (dir string, p *process, id string) {
	t.Helper()
	dir = t.TempDir()
	p = startNode(t, "up", upArgs(dir, "alpha")...)
	shopSeed := registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: "+shopEmits+"\n")
	billingSeed := registerModule(t, dir, "module: billing\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	broken, err := sdk.Connect(ctx, p.clientURL, billingSeed, sdk.WithRetryBackoff(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { broken.Close() })
	if err := broken.On("shop.order.placed", func(context.Context, sdk.Event) error { return errors.New("no such customer") }); err != nil {
		t.Fatal(err)
	}
	shop, err := sdk.Connect(ctx, p.clientURL, shopSeed)
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	if id, err = shop.Emit(ctx, "order.placed", map[string]int{"order": 7}); err != nil {
		t.Fatal(err)
	}
	return dir, p, id
}

// awaitNewLetter waits for a dead letter other than the one numbered not.
func awaitNewLetter(t *testing.T, dir string, not uint64) deadLetter {
	t.Helper()
	var got deadLetter
	retryUntil(t, 20*time.Second, func() error {
		ls, err := deadLs(t, dir)
		if err != nil {
			return err
		}
		for _, l := range ls {
			if l.ID != not {
				got = l
				return nil
			}
		}
		return fmt.Errorf("no new dead letter: %+v", ls)
	})
	return got
}

// TestBinary_DeadReplayReachesOnlyItsConsumer: two modules consume one event; billing gives
// up on it and mailer handles it. The replay reaches billing alone — mailer, idle, still has
// handled it once — and the audit log holds the event once.
func TestBinary_DeadReplayReachesOnlyItsConsumer(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	shopSeed := registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	billingSeed := registerModule(t, dir, "module: billing\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\n")
	mailerSeed := registerModule(t, dir, "module: mailer\nrequires: [mesh-bus]\nconsumes: [\"**\"]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var fixed atomic.Bool
	var billed, mailed atomic.Int32
	billing, err := sdk.Connect(ctx, p.clientURL, billingSeed, sdk.WithRetryBackoff(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer billing.Close()
	if err := billing.On("shop.order.placed", func(context.Context, sdk.Event) error {
		if !fixed.Load() {
			return errors.New("no such customer")
		}
		billed.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mailer, err := sdk.Connect(ctx, p.clientURL, mailerSeed)
	if err != nil {
		t.Fatal(err)
	}
	defer mailer.Close()
	if err := mailer.On("**", func(_ context.Context, e sdk.Event) error {
		if e.Key == "shop.order.placed" {
			mailed.Add(1)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	shop, err := sdk.Connect(ctx, p.clientURL, shopSeed)
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	id, err := shop.Emit(ctx, "order.placed", map[string]int{"order": 7})
	if err != nil {
		t.Fatal(err)
	}
	var letter deadLetter
	retryUntil(t, 20*time.Second, func() error {
		ls, err := deadLs(t, dir)
		if err != nil || len(ls) != 1 {
			return fmt.Errorf("dead letters %+v: %v", ls, err)
		}
		letter = ls[0]
		return nil
	})
	if letter.EventID != id || letter.Consumer != "billing" || letter.Subject != manifest.EventSubject("shop", "order.placed") {
		t.Fatalf("dead letter %+v", letter)
	}
	fixed.Store(true)
	if r := meshnode(t, nil, "dead", "replay", fmt.Sprint(letter.ID), "--data-dir", dir); r.code != 0 {
		t.Fatalf("dead replay: exit %d %s", r.code, r.stderr)
	}
	retryUntil(t, 20*time.Second, func() error {
		if billed.Load() != 1 {
			return fmt.Errorf("billing handled the replay %d times", billed.Load())
		}
		return nil
	})
	// Had the replay matched mailer's filter, it would be pending, in flight or handled.
	op, err := dialWith(p.clientURL, filepath.Join(dir, node.OperatorSeedFile))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	js, _ := jetstream.New(op)
	idle := func(consumer string) {
		retryUntil(t, 10*time.Second, func() error {
			c, err := js.Consumer(ctx, manifest.EventsStreamName, consumer)
			if err != nil {
				return err
			}
			info, err := c.Info(ctx)
			if err != nil {
				return err
			}
			if info.NumPending != 0 || info.NumAckPending != 0 {
				return fmt.Errorf("%s: %d pending, %d unacked", consumer, info.NumPending, info.NumAckPending)
			}
			return nil
		})
	}
	idle("mailer")
	if n := mailed.Load(); n != 1 {
		t.Errorf("mailer handled the event %d times, want once", n)
	}
	idle(manifest.AuditConsumer("alpha").Name) // the audit log has read the replay too
	r := meshnode(t, nil, "audit", "query", "--id", id, "--json", "--data-dir", dir)
	if n := strings.Count(strings.TrimSpace(r.stdout), "\n") + 1; r.code != 0 || n != 1 || !strings.Contains(r.stdout, id) {
		t.Errorf("audit query: the event %s is recorded %d times, want once (exit %d)\n%s%s", id, n, r.code, r.stdout, r.stderr)
	}
}

// TestBinary_DeadReplayRefusedWhenConsumesChanged: billing gave up on an event and was then
// re-registered without consuming it: replay refuses the letter (billing would only refuse
// the event) and keeps it.
func TestBinary_DeadReplayRefusedWhenConsumesChanged(t *testing.T) {
	dir, _, _ := failedOrder(t, "[order.placed, order.paid]")
	letters := []deadLetter{awaitNewLetter(t, dir, 0)}
	registerModule(t, dir, "module: billing\nrequires: [mesh-bus]\nconsumes: [shop.order.paid]\n")
	r := meshnode(t, nil, "dead", "replay", fmt.Sprint(letters[0].ID), "--data-dir", dir)
	if r.code != 1 || !strings.Contains(r.stderr, "no longer consumes shop.order.placed") || !strings.Contains(r.stderr, "kept") {
		t.Errorf("replay after billing stopped consuming the event: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if after, err := deadLs(t, dir); err != nil || len(after) != 1 {
		t.Errorf("the letter was not kept: %v %+v", err, after)
	}
}
