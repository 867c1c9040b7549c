package node_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
)

// TestBed_SDKRefusalIsImmediate: a call the sdk lets through but the bus refuses (a module
// calling its own tool: the sdk does not check it, the bus grants no publish there) fails at
// once with the bus's refusal, naming the subject. Before, the request waited for its
// deadline (the sdk's default 10 s, or the caller's) and only then looked for a refusal.
func TestBed_SDKRefusalIsImmediate(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: shop\nrequires: [mesh-bus]\ntools: [status]\n")
	c := b.client(seed)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	subject := manifest.ToolSubject("shop", "status")
	start := time.Now()
	_, err := c.Call(ctx, "shop", "status", nil)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the refused call took %s", took)
	}
	if !errors.Is(err, sdk.ErrPermission) || !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("Call of a subject the bus refuses: %v, want ErrPermission and nats.ErrPermissionViolation", err)
	}
	if !strings.Contains(err.Error(), "may not publish to "+subject) {
		t.Fatalf("the refusal %q does not name %s", err, subject)
	}
	// The connection stays open, and a second refused call fails the same way.
	if _, err := c.Call(ctx, "shop", "status", nil); !errors.Is(err, sdk.ErrPermission) {
		t.Fatalf("a second refused call: %v", err)
	}
}
