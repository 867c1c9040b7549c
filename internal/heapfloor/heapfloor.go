// Package heapfloor keeps the garbage collector's heap goal at a floor while the live heap is
// small: a node's heap is a few MB (6 MB live in the flood benchmark's bed), so with the
// runtime's default (GOGC 100, a goal of about twice the live heap) a node under steady work
// collected every 0.37 s, 3–5 ms each on its one core, and the 1% of operations that met a
// collection made their p99 (docs/performance.md, "Floods"). Above the floor the default
// stands: a node carrying 10,000 modules keeps a goal of twice its 1.2 GB, not more. The
// operator's GOGC, when set, is left alone.
package heapfloor

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Floor is the heap goal kept while the live heap is under about half of it. Measured with
// the flood benchmark (docs/performance.md, "Floods").
const Floor = 64 << 20

// every is how often the live heap is read: it changes slowly, and between two reads a goal
// set for a smaller heap holds at most one collection's growth.
const every = 250 * time.Millisecond

// Percent is the GOGC that makes the heap goal at least floor, the live heap being live and
// the other roots the collector scans (goroutine stacks, globals) roots: since Go 1.18 the
// goal is live + (live + roots) × GOGC/100. It is the default 100 where that already reaches
// the floor, and for a heap not measured yet.
func Percent(live, roots, floor uint64) int {
	if live == 0 || live+live+roots >= floor {
		return 100
	}
	return int(((floor-live)*100 + live + roots - 1) / (live + roots)) // rounded up: not a byte under
}

// operatorless reports whether the environment leaves GOGC to the node.
func operatorless() bool { return os.Getenv("GOGC") == "" }

// keeper is the process's one: GOGC is the process's, so a second Keep (two nodes in one
// process) shares the first's.
var keeper struct {
	sync.Mutex
	users int
	stop  func()
}

// Keep keeps the heap goal at Floor until ctx ends or the last Keep's stop is called (and
// then sets back the GOGC it found), unless the environment sets GOGC; it returns what
// stops it and waits for it.
func Keep(ctx context.Context) (stop func()) {
	if !operatorless() {
		return func() {}
	}
	keeper.Lock()
	defer keeper.Unlock()
	keeper.users++
	if keeper.users == 1 {
		keeper.stop = keep(ctx)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			keeper.Lock()
			defer keeper.Unlock()
			if keeper.users--; keeper.users == 0 {
				keeper.stop()
			}
		})
	}
}

// keep sets GOGC from the live heap every while until ctx ends or it is stopped.
func keep(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		heap := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}
		found := -1 // the GOGC before the first change, set back at the end
		last := 0
		defer func() {
			if found >= 0 {
				debug.SetGCPercent(found)
			}
		}()
		for {
			metrics.Read(heap)
			for _, s := range heap {
				if s.Value.Kind() != metrics.KindUint64 {
					return // a runtime that does not say: the default stands
				}
			}
			p := Percent(heap[0].Value.Uint64(), heap[1].Value.Uint64()+heap[2].Value.Uint64(), Floor)
			if p != last {
				if was := debug.SetGCPercent(p); found < 0 {
					found = was
				}
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
