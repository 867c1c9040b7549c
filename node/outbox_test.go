package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go/jetstream"
)

// TestOutbox_RegistryEvents: a registration and a removal are each recorded as the node's
// event, signed by it; the event is stored with the change and taken out of the record once
// published, and a removed module's record is deleted once its event is out. A module
// registered again after its removal is new.
func TestOutbox_RegistryEvents(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	_, reg := b.register("module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events, err := b.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := b.js.KeyValue(ctx, registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	// event returns the body of the node's last event of action, once it names module.
	event := func(action, module string) map[string]any {
		var body map[string]any
		retryUntil(t, 10*time.Second, func() error {
			m, err := events.GetLastMsgForSubject(ctx, manifest.NodeEventSubject("alpha", action))
			if err != nil {
				return err
			}
			if err := envelope.Verify(m.Header, m.Subject, m.Data, b.n.Identity().PublicKey); err != nil {
				return fmt.Errorf("%s: %w", action, err)
			}
			body = nil
			if err := json.Unmarshal(m.Data, &body); err != nil || body["module"] != module {
				return fmt.Errorf("last %s: %s", action, m.Data)
			}
			return nil
		})
		return body
	}
	if body := event(registry.EventRegistered, "shop"); body["public_key"] != reg.PublicKey || body["created"] != true {
		t.Errorf("registered: %v", body)
	}
	retryUntil(t, 10*time.Second, func() error {
		e, err := kv.Get(ctx, "module.shop")
		if err != nil {
			return err
		}
		if strings.Contains(string(e.Value()), `"outbox"`) {
			return fmt.Errorf("the record still holds its event: %s", e.Value())
		}
		return nil
	})

	if _, err := admin.Remove(ctx, b.op, api.RemoveRequest{Module: "shop"}); err != nil {
		t.Fatal(err)
	}
	event(registry.EventRemoved, "shop")
	retryUntil(t, 10*time.Second, func() error {
		if _, err := kv.Get(ctx, "module.shop"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("the removed module's record: %v", err)
		}
		return nil
	})
	_, again := b.register("module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	if !again.Created || again.PublicKey == reg.PublicKey {
		t.Errorf("registered again after removal: created %v, key %s (was %s)", again.Created, again.PublicKey, reg.PublicKey)
	}
}

// TestOutbox_PublishedAfterACrash: records left holding events — as a node killed between
// storing a change and publishing its event leaves them — are published by the next start,
// and taken out of the records: a registration's, a removal's (whose record is then
// deleted) and a secret's rotation.
func TestOutbox_PublishedAfterACrash(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	b := newBedAt(t, cfg)
	b.register("module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	b.register("module: gone\nrequires: [mesh-bus]\n")
	b.register("module: back\nrequires: [mesh-bus]\n")
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "shop", Name: "key"}, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// inject adds a waiting event to the JSON record at key of bucket, and returns its id.
	inject := func(bucket, key string, event map[string]any, edit func(map[string]any)) string {
		kv, err := b.js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		id := uuid.Must(uuid.NewV7()).String()
		event["id"] = id
		rec["outbox"] = []any{event}
		if edit != nil {
			edit(rec)
		}
		raw, _ := json.Marshal(rec)
		if _, err := kv.Update(ctx, key, raw, e.Revision()); err != nil {
			t.Fatal(err)
		}
		return id
	}
	registered := inject(registry.Bucket, "module.shop", map[string]any{
		"action": registry.EventRegistered, "node": "alpha", "body": map[string]any{"module": "shop", "injected": true}}, nil)
	removed := inject(registry.Bucket, "module.gone", map[string]any{
		"action": registry.EventRemoved, "node": "alpha", "body": map[string]any{"module": "gone", "injected": true}},
		func(rec map[string]any) { rec["removed"] = true })
	// A module registered again while its removal's event waits: the new record keeps it.
	backRemoved := inject(registry.Bucket, "module.back", map[string]any{
		"action": registry.EventRemoved, "node": "alpha", "body": map[string]any{"module": "back", "injected": true}},
		func(rec map[string]any) { rec["removed"] = true })
	retryUntil(t, 10*time.Second, func() error { // the controller's mirror has it as removed
		mods, err := admin.List(ctx, b.op)
		if err != nil {
			return err
		}
		for _, m := range mods {
			if m.Module == "back" {
				return errors.New("back is still listed")
			}
		}
		return nil
	})
	_, back := b.register("module: back\nrequires: [mesh-bus]\nemits: [y]\n")
	if !back.Created {
		t.Errorf("back registered over its removed record: %+v", back)
	}
	rotated := inject(vault.Bucket, "secret.shop.key", map[string]any{
		"action": "rotated", "body": map[string]any{"owner": "shop", "name": "key", "injected": true}}, nil)
	b.close()

	b = newBedAt(t, cfg) // the next start publishes what the records hold
	// back's removal went out when back was registered again (the sweeper was woken), or
	// now; either way it is in EVENTS once.
	retryUntil(t, 20*time.Second, func() error {
		if n := eventWithID(t, b, manifest.NodeEventSubject("alpha", registry.EventRemoved), backRemoved); n != 1 {
			return fmt.Errorf("back's removal recorded %d times", n)
		}
		return nil
	})
	for id, subject := range map[string]string{
		registered: manifest.NodeEventSubject("alpha", registry.EventRegistered),
		removed:    manifest.NodeEventSubject("alpha", registry.EventRemoved),
		rotated:    api.VaultEventSubject("rotated"),
	} {
		retryUntil(t, 20*time.Second, func() error {
			if n := eventWithID(t, b, subject, id); n != 1 {
				return fmt.Errorf("%s with the injected id %s: %d in EVENTS, want 1", subject, id, n)
			}
			return nil
		})
	}
	registryKV, _ := b.js.KeyValue(ctx, registry.Bucket)
	vaultKV, _ := b.js.KeyValue(ctx, vault.Bucket)
	retryUntil(t, 20*time.Second, func() error {
		for _, c := range []struct {
			kv  jetstream.KeyValue
			key string
		}{{registryKV, "module.shop"}, {vaultKV, "secret.shop.key"}} {
			e, err := c.kv.Get(ctx, c.key)
			if err != nil {
				return err
			}
			if strings.Contains(string(e.Value()), `"outbox"`) {
				return fmt.Errorf("%s still holds its event", c.key)
			}
		}
		if _, err := registryKV.Get(ctx, "module.gone"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("the removed module's record: %v", err)
		}
		return nil
	})
}

// eventWithID counts the messages on subject in EVENTS whose x-event-id is id.
func eventWithID(t *testing.T, b *bed, subject, id string) int {
	t.Helper()
	n := 0
	b.eachMessage(t, manifest.EventsStreamName, subject, func(m jetstream.Msg) {
		if m.Headers().Get(envelope.EventID) == id {
			n++
		}
	})
	return n
}
