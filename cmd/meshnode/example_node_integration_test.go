//go:build integration

package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
)

// TestIntegration_NodeExample_Module runs examples/node/module.js, with nothing but the plain nats and
// nkeys.js packages, against a real node: it consumes a Go module's events with its durable
// consumer, emits signed events that the Go sdk's checks accept, serves its tool, and an
// event it NAKs five times is dead-lettered by the node with its deliveries; a forged event
// it refuses is dead-lettered with its reason.
func TestIntegration_NodeExample_Module(t *testing.T) {
	exampleDir := nodeExample(t)
	b := newExampleBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b.runNotes(t, ctx, exampleDir, "node", "module.js")

	// The Go side: a reader whose sdk checks every event of notes, signature included.
	got, shop := notesPair(ctx, t, b.p.clientURL, b.readerSeed, b.shopSeed, sdk.RootCA(b.ca()))
	okID, err := shop.Emit(ctx, "order.placed", map[string]any{"order": 1})
	if err != nil {
		t.Fatal(err)
	}
	failID, err := shop.Emit(ctx, "order.placed", map[string]any{"order": 2, "fail": true})
	if err != nil {
		t.Fatal(err)
	}
	awaitNote(t, ctx, got, okID, "module.js")

	// The failing event: NAKed 5 times by module.js, dead-lettered by the node.
	letters := b.deadLetters(t, 1, 30*time.Second)
	if l := letters[0]; l.EventID != failID || l.Consumer != "notes" || l.Deliveries != manifest.MaxDeliver || l.Reason != "max deliveries" {
		t.Errorf("dead letter %+v, want %s from notes after %d deliveries", l, failID, manifest.MaxDeliver)
	}

	// A forged event (shop's subject, signed by shop, x-source another module) is refused by
	// module.js's checks, with its reason.
	op := b.forge(t)
	letters = b.deadLetters(t, 2, 20*time.Second)
	if l := letters[1]; !strings.Contains(l.Reason, `x-source "reader" does not own`) {
		t.Errorf("forged event's dead letter: %+v", l)
	}

	// Its tool answers the operator.
	msg, err := op.Request(manifest.ToolSubject("notes", "status"), []byte(`{}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var status struct {
		Module           string
		Handled, Refused int
		Failed, Emitted  int
	}
	if err := json.Unmarshal(msg.Data, &status); err != nil || status.Module != "notes" || status.Handled != 1 || status.Refused != 1 || status.Failed != manifest.MaxDeliver {
		t.Errorf("status tool: %s (%v)", msg.Data, err)
	}
}
