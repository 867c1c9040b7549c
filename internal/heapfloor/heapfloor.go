// Package heapfloor keeps the garbage collector's heap goal at a floor while the live heap is
// small: a node's heap is a few MB (6 MB live in the flood benchmark's bed), so with the
// runtime's default (GOGC 100, a goal of twice the live heap) a node under steady work
// collected every 0.37 s, 3–5 ms each on its one core, and the 1% of operations that met a
// collection made their p99 (docs/performance.md, "The collector's floor"). Above the floor
// the default stands: a node carrying 10,000 modules keeps a goal of twice its 1.2 GB, not
// more. The operator's GOGC, when set, is left alone.
package heapfloor

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Floor is the heap goal kept while the live heap is under half of it.
const Floor = 64 << 20

// operatorless reports whether the environment leaves GOGC to the node.
func operatorless() bool { return os.Getenv("GOGC") == "" }

// every is how often the live heap is read: it changes slowly, and between two reads a goal
// set for a smaller heap holds at most one collection's growth.
const every = 250 * time.Millisecond

// Percent is the GOGC that makes the goal (live × (1 + GOGC/100)) at least floor: the
// default 100 from a live heap of half the floor up, and nothing for a heap not measured yet.
func Percent(live, floor uint64) int {
	if live == 0 || 2*live >= floor {
		return 100
	}
	return int((floor*100+live-1)/live) - 100 // rounded up: the goal is not a byte under
}

// Keep keeps the heap goal at Floor until ctx ends or it is stopped (and then sets GOGC 100
// again), unless the environment sets GOGC; it returns what stops it and waits for it.
func Keep(ctx context.Context) (stop func()) {
	if !operatorless() {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		last := 100
		defer func() { debug.SetGCPercent(100) }()
		for {
			metrics.Read(live)
			if live[0].Value.Kind() != metrics.KindUint64 {
				return // a runtime that does not say: the default stands
			}
			if p := Percent(live[0].Value.Uint64(), Floor); p != last {
				debug.SetGCPercent(p)
				last = p
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}
