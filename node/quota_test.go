package node_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go/jetstream"
)

// TestQuota_ModuleOverQuota: one module emitting past module-events-max-bytes has its emits
// refused with an error that says why and what to do, while another module's emits go on;
// the node reports it as an event; a node restarted with a larger quota accepts its emits
// again, counting what the module already holds (the usage survives the restart).
func TestQuota_ModuleOverQuota(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.ModuleEventsMaxBytes = 64 << 10
	b := newBedAt(t, cfg)
	noisySeed, _ := b.register("module: noisy\nrequires: [mesh-bus]\nemits: [noise]\n")
	quietSeed, _ := b.register("module: quiet\nrequires: [mesh-bus]\nemits: [tick]\n")
	noisy, quiet := b.client(noisySeed), b.client(quietSeed)
	payload := map[string]string{"pad": strings.Repeat("x", 2048)}

	var refused error
	sent := 0
	retryUntil(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := noisy.Emit(ctx, "noise", payload)
		switch {
		case err == nil:
			sent++
			return fmt.Errorf("emit %d accepted (about %d KiB)", sent, sent*2)
		case errors.Is(err, sdk.ErrOverQuota):
			refused = err
			return nil
		}
		return err // the kick's dropped connection: try again
	})
	if sent < 30 {
		t.Fatalf("refused after %d emits of 2 KiB, under the 64 KiB quota: %v", sent, refused)
	}
	if !errors.Is(refused, sdk.ErrPermission) || !strings.Contains(refused.Error(), "module-events-max-bytes") {
		t.Fatalf("the refusal %q does not say it is the bus's, nor which setting to raise", refused)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := quiet.Emit(ctx, "tick", map[string]int{"n": 1}); err != nil {
		t.Fatalf("another module's emit while one is over its quota: %v", err)
	}
	retryUntil(t, 10*time.Second, func() error {
		n := 0
		b.eachMessage(t, manifest.EventsStreamName, manifest.NodeEventSubject("alpha", "over-quota"), func(m jetstream.Msg) {
			if strings.Contains(string(m.Data()), `"module":"noisy"`) {
				n++
			}
		})
		if n != 1 {
			return fmt.Errorf("%d over-quota events for noisy, want 1", n)
		}
		return nil
	})

	// Restarted with the same quota: still over (the usage is on disk, not in memory).
	b.close()
	b = newBedAt(t, cfg)
	noisy = b.client(noisySeed)
	retryUntil(t, 15*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := noisy.Emit(ctx, "noise", payload); !errors.Is(err, sdk.ErrOverQuota) {
			return fmt.Errorf("emit after a restart: %v, want the quota's refusal", err)
		}
		return nil
	})
	// Restarted with a quota four times as large: accepted again.
	b.close()
	cfg.ModuleEventsMaxBytes = config.Bytes(256 << 10)
	b = newBedAt(t, cfg)
	noisy = b.client(noisySeed)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if _, err := noisy.Emit(ctx2, "noise", payload); err != nil {
		t.Fatalf("emit under a raised quota: %v", err)
	}
}
