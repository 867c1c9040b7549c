//go:build integration

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

	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// deadRow is one line of `meshnode dead ls --json`: the shape `dead show` prints too.
type deadRow struct {
	ID         uint64            `json:"id"`
	Subject    string            `json:"subject"`
	Consumer   string            `json:"consumer"`
	Reason     string            `json:"reason"`
	Deliveries int               `json:"deliveries"`
	EventID    string            `json:"event_id"`
	Headers    map[string]string `json:"headers"`
	Body       json.RawMessage   `json:"body"`
}

// deadLs is `meshnode dead ls --json`, decoded.
func deadLs(t *testing.T, dir string) ([]deadRow, error) {
	t.Helper()
	r := meshnode(t, nil, "dead", "ls", "--json", "--data-dir", dir)
	if r.code != 0 {
		return nil, errors.New(r.stderr)
	}
	var out []deadRow
	for line := range strings.SplitSeq(strings.TrimSpace(r.stdout), "\n") {
		if line == "" {
			continue
		}
		var d deadRow
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// TestIntegration_Binary_DeadReplayRefusesForgery: dead letters naming the registry's operator key or
// EVENTS' delete API — written with the operator's own connection, as an attacker who got
// one into DEAD would — are refused by replay, one by one and with --all, and kept; the
// targets are untouched.
func TestIntegration_Binary_DeadReplayRefusesForgery(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	shopSeed := registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	registerModule(t, dir, "module: billing\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\n")
	op, err := dialWith(p.clientURL, filepath.Join(dir, datadir.OperatorSeedFile))
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

// TestIntegration_Binary_DeadReplayDiesAgain: a replayed event that fails again is dead-lettered again, as
// a new letter with the same event id.
func TestIntegration_Binary_DeadReplayDiesAgain(t *testing.T) {
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
func awaitNewLetter(t *testing.T, dir string, not uint64) deadRow {
	t.Helper()
	var got deadRow
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

// TestIntegration_Binary_DeadReplayReachesOnlyItsConsumer: two modules consume one event; billing gives
// up on it and mailer handles it. The replay reaches billing alone — mailer, idle, still has
// handled it once — and the audit log holds the event once.
func TestIntegration_Binary_DeadReplayReachesOnlyItsConsumer(t *testing.T) {
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
	var letter deadRow
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
	op, err := dialWith(p.clientURL, filepath.Join(dir, datadir.OperatorSeedFile))
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
	// A prefix of an id matches nothing, and says so rather than print nothing.
	r = meshnode(t, nil, "audit", "query", "--id", id[:8], "--data-dir", dir)
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "--id takes the whole x-event-id") {
		t.Errorf("audit query of an id's prefix: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestIntegration_Binary_DeadReplayRefusedWhenConsumesChanged: billing gave up on an event and was then
// re-registered without consuming it: replay refuses the letter (billing would only refuse
// the event) and keeps it.
func TestIntegration_Binary_DeadReplayRefusedWhenConsumesChanged(t *testing.T) {
	dir, _, _ := failedOrder(t, "[order.placed, order.paid]")
	letters := []deadRow{awaitNewLetter(t, dir, 0)}
	registerModule(t, dir, "module: billing\nrequires: [mesh-bus]\nconsumes: [shop.order.paid]\n")
	r := meshnode(t, nil, "dead", "replay", fmt.Sprint(letters[0].ID), "--data-dir", dir)
	if r.code != 1 || !strings.Contains(r.stderr, "no longer consumes shop.order.placed") || !strings.Contains(r.stderr, "kept") {
		t.Errorf("replay after billing stopped consuming the event: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if after, err := deadLs(t, dir); err != nil || len(after) != 1 {
		t.Errorf("the letter was not kept: %v %+v", err, after)
	}
}
