package main

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// trimEvery is how often a node's process looks whether it has been idle, and if so hands
// the heap's free pages back to the system.
const trimEvery = 30 * time.Second

// startTrimming starts trimIdleMemory for a node's process and returns what stops it. The
// runtime has counted its collections since Go 1.16; without the count nothing is trimmed.
func startTrimming(ctx context.Context) (stop func()) {
	if _, ok := gcCycles(); !ok {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(trimEvery)
		defer t.Stop()
		trimIdleMemory(ctx, t.C, &trimmer{collections: func() uint64 { n, _ := gcCycles(); return n }, trim: debug.FreeOSMemory})
	})
	return func() { cancel(); wg.Wait() }
}

// trimIdleMemory ends a trimmer's period at each tick, until ctx ends.
//
// The runtime keeps the pages it has freed up to its heap goal: about twice the live heap,
// and at least 64 MiB while the heap is small (internal/heapfloor). An idle node allocates
// tens of KB a second (lease renewals, reports, nats-server's block buffers), too little for
// the collector to run more than every minute or two, so without a trim its resident memory
// climbs by that headroom and stays there (docs/performance.md, "Start-up and idle", has the
// figures). A small node allocating under about 2 MB a second collects at most once a period
// too, and is trimmed; under more load the collector runs many times a period and nothing
// is forced. A trim costs one collection of the live heap.
func trimIdleMemory(ctx context.Context, ticks <-chan time.Time, t *trimmer) {
	t.last = t.collections()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			t.period()
		}
	}
}

// trimmer hands the heap's free pages back to the system at the end of a period in which
// the collector ran at most once on its own.
type trimmer struct {
	collections func() uint64 // how many collections the runtime has completed
	trim        func()        // a collection, then every free page returned (debug.FreeOSMemory)
	last        uint64        // collections at the end of the last period
}

// period ends a period, and reports whether it trimmed.
func (t *trimmer) period() bool {
	now := t.collections()
	idle := now-t.last <= 1
	if idle {
		t.trim()
		now = t.collections() // the trim's own collection is not the node's
	}
	t.last = now
	return idle
}

// gcCycles is how many collections the runtime has completed, read without stopping the
// world (runtime.ReadMemStats would); false if this runtime does not count them.
func gcCycles() (uint64, bool) {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0, false
	}
	return s[0].Value.Uint64(), true
}
