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

// TestPercent: the goal is at least the floor while the live heap is under half of it, and
// the default above.
func TestPercent(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 100},              // not measured yet
		{Floor / 8, 700},      // goal 8 × live = Floor
		{Floor / 4, 300},      // goal 4 × live = Floor
		{Floor / 2, 100},      // the default's goal is the floor
		{10 * Floor, 100},     // a big node keeps the default
		{Floor / 1000, 99902}, // a tiny heap: a high GOGC, rounded up to reach the floor
	} {
		if got := Percent(c.live, Floor); got != c.want {
			t.Errorf("Percent(%d, Floor) = %d, want %d", c.live, got, c.want)
		}
		if goal := c.live * uint64(100+Percent(c.live, Floor)) / 100; c.live != 0 && goal < Floor {
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
	stop()
	if p := gogc(); p != 100 {
		t.Fatalf("GOGC %d after Keep stopped, want 100", p)
	}
	if !operatorless() {
		t.Fatal("GOGC empty is not left to the node")
	}
	t.Setenv("GOGC", "200")
	if operatorless() {
		t.Fatal("the operator's GOGC=200 is not theirs")
	}
}
