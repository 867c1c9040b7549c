//go:build integration

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
)

// TestIntegration_PythonExample_Module runs examples/python-module/module.py — the standard
// library and PyNaCl, no NATS client — against a real node: it consumes a Go module's event
// with its durable consumer and answers it with a signed event that the Go sdk's checks
// accept and the node's audit log records as genuine, from node alpha; a forged event it refuses is
// dead-lettered with its reason; its tool answers the operator.
func TestIntegration_PythonExample_Module(t *testing.T) {
	python, exampleDir := pythonExample(t)
	b := newExampleBed(t)
	dir := b.dir
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b.runNotes(t, ctx, exampleDir, python, "module.py")

	// The Go side: a reader whose sdk checks every event of notes, signature included.
	got, shop := notesPair(ctx, t, b.p.clientURL, b.readerSeed, b.shopSeed, sdk.RootCA(b.ca()))
	okID, err := shop.Emit(ctx, "order.placed", map[string]any{"order": 1})
	if err != nil {
		t.Fatal(err)
	}
	noteID := awaitNote(t, ctx, got, okID, "module.py").ID

	// The node's audit log holds the note as genuine: signed by notes' key, its source owns
	// its subject, and the verdict flags nothing.
	retryUntil(t, 20*time.Second, func() error {
		r := meshnode(t, nil, "audit", "query", "--source", "notes", "--json", "--data-dir", dir)
		var rec struct {
			EventID       string            `json:"event_id"`
			Signed        bool              `json:"signed"`
			SourceMatches bool              `json:"source_matches"`
			NotGenuine    string            `json:"not_genuine"`
			Headers       map[string]string `json:"headers"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rec) != nil || rec.EventID != noteID {
			return fmt.Errorf("audit query --source notes: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		if !rec.Signed || !rec.SourceMatches || rec.NotGenuine != "" {
			t.Fatalf("the audit log does not hold module.py's event as genuine: %s", r.stdout)
		}
		// x-node names the server the module reached, as the Go sdk's does.
		if got := rec.Headers["x-node"]; got != "alpha" {
			t.Errorf("module.py's x-node is %q, want alpha (INFO's server_name)", got)
		}
		return nil
	})
	if r := meshnode(t, nil, "audit", "verify", "--data-dir", dir); r.code != 0 {
		t.Fatalf("audit verify after module.py's event: exit %d %s %s", r.code, r.stdout, r.stderr)
	}

	// A forged event (shop's subject, signed by shop, x-source another module) is refused by
	// module.py's checks and dead-lettered with its reason.
	op := b.forge(t)
	letters := b.deadLetters(t, 1, 20*time.Second)
	if l := letters[0]; l.Consumer != "notes" || !strings.Contains(l.Reason, `x-source "reader" does not own`) {
		t.Errorf("forged event's dead letter: %+v", l)
	}

	// Its tool answers the operator.
	msg, err := op.Request(manifest.ToolSubject("notes", "status"), []byte(`{}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var status struct {
		Module                    string
		Handled, Refused, Emitted int
	}
	if err := json.Unmarshal(msg.Data, &status); err != nil || status.Module != "notes" || status.Handled != 1 || status.Refused != 1 || status.Emitted != 1 {
		t.Errorf("status tool: %s (%v)", msg.Data, err)
	}
}
