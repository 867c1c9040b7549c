package main

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// trimEvery is how often a node's process looks whether it has been idle, and if so hands
// the heap's free pages back to the system.
const trimEvery = 30 * time.Second

// trimIdleMemory hands the heap's free pages back to the system at the end of every period
// in which the collector ran at most once on its own, until ctx ends.
//
// The runtime keeps the pages it has freed up to its heap goal, about twice the live heap.
// An idle node allocates tens of KB a second (lease renewals, reports, nats-server's block
// buffers), too little for the collector to run more than every minute or two, so its
// resident memory climbs by that headroom and stays there: on 2026-12-03, 30.8 MiB ten
// seconds after ready and 35.0 MiB four idle minutes later, against 30.4–31.3 MiB over the
// same minutes with a trim every 30 s. Under load the collector runs several times a second
// and nothing is forced; idle, forcing it over a 5 MB heap costs a few milliseconds.
func trimIdleMemory(ctx context.Context, every time.Duration, collections func() uint64, trim func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	last := collections()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := collections()
		if now-last <= 1 {
			trim()
			now = collections() // the trim's own collection is not the node's
		}
		last = now
	}
}

// gcCycles is how many collections the runtime has completed, read without stopping the
// world (runtime.ReadMemStats would).
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// freeOSMemory is debug.FreeOSMemory: a collection, then every free page returned.
func freeOSMemory() { debug.FreeOSMemory() }
