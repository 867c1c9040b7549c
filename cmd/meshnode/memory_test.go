package main

import (
	"context"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestTrimmer_Periods: a period ends with a trim when the node's process collected at most
// once in it, not counting the last trim's own collection; a busier one does not.
func TestTrimmer_Periods(t *testing.T) {
	var gcs, trims uint64
	tr := &trimmer{
		collections: func() uint64 { return gcs },
		trim:        func() { gcs++; trims++ }, // FreeOSMemory collects
	}
	for i, p := range []struct {
		own  uint64 // collections the node made in the period
		trim bool
	}{
		{0, true},
		{1, true}, // after a trim: its collection is not counted
		{1, true},
		{2, false},
		{1, true}, // after a busy period
		{0, true},
		{40, false},
		{0, true},
	} {
		gcs += p.own
		before := trims
		if got := tr.period(); got != p.trim || (trims-before == 1) != p.trim {
			t.Fatalf("period %d with %d collections of its own: trimmed %v (%d trims), want %v", i, p.own, got, trims-before, p.trim)
		}
	}
}

// TestTrimIdleMemory: the loop ends a period at each tick until its context ends.
func TestTrimIdleMemory(t *testing.T) {
	var trims atomic.Uint64
	ticks := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		trimIdleMemory(ctx, ticks, &trimmer{collections: func() uint64 { return 0 }, trim: func() { trims.Add(1) }})
	})
	for range 3 {
		ticks <- time.Now()
	}
	cancel()
	wg.Wait()
	// Each tick was taken before the cancel, and a taken tick's period always ends.
	if n := trims.Load(); n != 3 {
		t.Fatalf("%d trims for three idle periods", n)
	}
}

// TestStartTrimming: the runtime counts its collections, a forced one included, and a
// started trimmer stops when told to.
func TestStartTrimming(t *testing.T) {
	before, ok := gcCycles()
	if !ok {
		t.Fatal("the runtime does not count its collections: nothing would be trimmed")
	}
	debug.FreeOSMemory()
	after, _ := gcCycles()
	if after <= before {
		t.Fatalf("collections %d then %d across a forced collection", before, after)
	}
	others := goleak.IgnoreCurrent()
	stop := startTrimming(context.Background())
	stop()
	goleak.VerifyNone(t, others) // stopped, its goroutine ends
}
