package heapfloor

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestPercent: the goal (live + (live + roots) × GOGC/100) is at least the floor while the
// default's is under it, and the default stands above.
func TestPercent(t *testing.T) {
	const roots = 1 << 20 // a node's stacks and globals: about 1 MB
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 100},                   // not measured yet
		{(Floor - roots) / 2, 100}, // the default's goal is the floor
		{10 * Floor, 100},          // a big node keeps the default
		{Floor / 8, 623},           // 8 MiB live: 8 + 9 × 6.23 ≥ 64
		{Floor / 1000, 6010},       // a tiny heap: a high GOGC, rounded up to reach the floor
	} {
		p := Percent(c.live, roots, Floor)
		if p != c.want {
			t.Errorf("Percent(%d, %d, Floor) = %d, want %d", c.live, roots, p, c.want)
		}
		if goal := c.live + (c.live+roots)*uint64(p)/100; c.live != 0 && goal < Floor {
			t.Errorf("live %d: goal %d under the floor", c.live, goal)
		}
	}
}

// gogc is the runtime's GOGC now.
func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestKeep: with GOGC unset, a test binary's few MB of live heap get a GOGC above 100, and
// stopping sets 100 again; GOGC set in the environment is the operator's.
func TestKeep(t *testing.T) {
	t.Setenv("GOGC", "")
	runtime.GC() // the live heap is measured by a collection: none has run yet, maybe
	stop := Keep(context.Background())
	testbed.RetryUntil(t, 5*time.Second, func() error {
		if p := gogc(); p <= 100 {
			return fmt.Errorf("GOGC %d with a live heap far under the floor", p)
		}
		return nil
	})
	again := Keep(context.Background()) // a second node in the process shares the keeper
	stop()
	if p := gogc(); p <= 100 {
		t.Fatalf("GOGC %d after the first of two Keeps stopped, want the floor's still", p)
	}
	again()
	if p := gogc(); p != 100 {
		t.Fatalf("GOGC %d after both Keeps stopped, want the 100 it found", p)
	}
	if !operatorless() {
		t.Fatal("GOGC empty is not left to the node")
	}
	t.Setenv("GOGC", "200")
	if operatorless() {
		t.Fatal("the operator's GOGC=200 is not theirs")
	}
}
