package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
)

// TestBudget_DeadShares: DEAD holds a share for each consumer whose letters it keeps; the
// registration that adds one it has no share for is refused, saying what to change, and one
// that adds none still passes.
func TestBudget_DeadShares(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.StoreMaxBytes = 64 << 20
	cfg.DeadMaxBytes = 1 << 20
	cfg.DeadMaxBytesPerConsumer = 128 << 10 // eight shares; the mesh's own consumers take three
	b := newBedAt(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.register("module: src\nrequires: [mesh-bus]\nemits: [tick]\n")
	var refused error
	registered := 0
	for refused == nil && registered < 8 {
		if _, refused = admin.Register(ctx, b.op, []byte(fmt.Sprintf("module: sink%d\nrequires: [mesh-bus]\nconsumes: [src.tick]\n", registered))); refused == nil {
			registered++
		}
	}
	if refused == nil || registered != 5 {
		t.Fatalf("DEAD of eight 128 KiB shares, three of them the mesh's: %d consumers registered, then %v; want five, and the sixth refused", registered, refused)
	}
	for _, want := range []string{"sink5", "dead-max-bytes-per-consumer", "raise dead-max-bytes"} {
		if !strings.Contains(refused.Error(), want) {
			t.Errorf("refusal %q does not say %q", refused, want)
		}
	}
	if _, err := admin.Register(ctx, b.op, []byte("module: sink0\nrequires: [mesh-bus]\nconsumes: [src.tick]\n")); err != nil {
		t.Errorf("sink0 registered again as it was: %v", err)
	}
	if _, err := admin.Register(ctx, b.op, []byte("module: quiet\nrequires: [mesh-bus]\nemits: [x]\n")); err != nil {
		t.Errorf("a module with no consumer, DEAD's shares all taken: %v", err)
	}
}
