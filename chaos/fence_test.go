package chaos_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/meshnode/meshnode/chaos"
)

// fenced checks only the fencing of h's operations.
func fenced(h *chaos.History) []chaos.Anomaly {
	var out []chaos.Anomaly
	for _, a := range chaos.Check(h.Ops(), chaos.Final{}, chaos.Bounds{}).Anomalies() {
		if a.Check == "fencing" {
			out = append(out, a)
		}
	}
	return out
}

func TestFence_Apply(t *testing.T) {
	h := chaos.NewHistory()
	f := chaos.NewFence(h, "seat")
	for _, c := range []struct {
		instance string
		epoch    uint64
		want     bool
	}{
		{"a", 1, true},
		{"a", 1, true}, // the same holder again
		{"b", 2, true},
		{"a", 1, false}, // a paused past its lease acts late
		{"b", 2, true},
	} {
		if got := f.Apply(c.instance, "job", c.epoch); got != c.want {
			t.Fatalf("Apply(%s, epoch %d) = %v, want %v", c.instance, c.epoch, got, c.want)
		}
	}
	ops := h.Ops()
	if got, want := ops[3].Err, "epoch 1 below 2"; !strings.Contains(got, want) || ops[3].OK {
		t.Errorf("refused effect recorded as OK=%v Err=%q, want an error naming %q", ops[3].OK, got, want)
	}
	if a := fenced(h); len(a) != 0 {
		t.Errorf("fenced effects have anomalies: %v", a)
	}
}

func TestFence_Bypassed(t *testing.T) {
	h := chaos.NewHistory()
	f := chaos.NewFence(h, "seat")
	f.Apply("a", "j1", 1)
	f.Apply("b", "j2", 2)
	// a receiver without the fence accepts a's late effect
	h.Invoke("a", "effect", "seat", "j3").DoneEpoch(1, nil)
	f.Apply("b", "j4", 2) // b goes on: still one stray effect, one anomaly
	if a := fenced(h); len(a) != 1 || a[0].Kind != "unfenced" {
		t.Errorf("anomalies = %v, want one unfenced effect", a)
	}
}

// TestFence_Concurrent offers effects of growing epochs from many holders at once: whatever
// the fence refuses, what it accepts never goes back, and the history shows it in order.
func TestFence_Concurrent(t *testing.T) {
	h := chaos.NewHistory()
	f := chaos.NewFence(h, "seat")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for e := range 50 {
				f.Apply(fmt.Sprintf("holder-%d", i), "job", uint64(e*8+i+1))
			}
		})
	}
	wg.Wait()
	if a := fenced(h); len(a) != 0 {
		t.Errorf("a fence's concurrent decisions have anomalies: %v", a)
	}
	if got, want := len(h.Ops()), 400; got != want {
		t.Errorf("recorded %d effects, want %d", got, want)
	}
}
