//go:build integration

package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/manifest"
	"golang.org/x/sync/errgroup"
)

// TestIntegration_ThousandSeats is issue 37's acceptance of seats that cost what they hold,
// through a node: on the store of issue 37's bench (57 GiB, what nats-server gave a node on
// its disk's free space), where 64 seats fitted before, 1,000 modules each declaring a seat
// with a work queue register (one in ten a 64 MiB backlog, the rest the default), and each
// queue is made with its reservation. That the same 1,000 seats fit among 10,000 modules is
// the budget's test (controller's TestBudget_TenThousandModules): registering 10,000 modules
// through one node takes more than ten minutes here, a registration timing out at module
// 8,998, which is the 10,000-module bench's to measure.
func TestIntegration_ThousandSeats(t *testing.T) {
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.StoreMaxBytes = 57 << 30
	b := newBedAt(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8) // registrations are one at a time in the controller; this keeps it busy
	for i := range 1_000 {
		backlog := ""
		if i%10 == 0 {
			backlog = "backlog: 64MiB, "
		}
		text := fmt.Sprintf("module: m%d\nrequires: [mesh-bus]\nseats:\n  s%d: {scope: mesh, retain: 1d, %saccepts: [run]}\n", i, i, backlog)
		g.Go(func() error {
			if _, err := admin.Register(gctx, b.op, []byte(text)); err != nil {
				return fmt.Errorf("register module %d: %w", i, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("1,000 seats registered in %v", time.Since(start).Round(time.Millisecond))
	for _, i := range []int{0, 1, 999} {
		seat := fmt.Sprintf("s%d", i)
		s, err := b.js.Stream(ctx, manifest.SeatStreamName(seat))
		if err != nil {
			t.Fatalf("%s: %v", manifest.SeatStreamName(seat), err)
		}
		want := int64(16 << 20) // the default on this store
		if i%10 == 0 {
			want = 64 << 20
		}
		if got := s.CachedInfo().Config.MaxBytes; got != want {
			t.Errorf("%s reserves %d, want %d", manifest.SeatStreamName(seat), got, want)
		}
	}
}
