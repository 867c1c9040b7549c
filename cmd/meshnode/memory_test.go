package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestTrimIdleMemory: a period in which the collector ran at most once ends with a trim; a
// busy one (the collector ran more) does not, and a trim's own collection does not make the
// next period look busy.
func TestTrimIdleMemory(t *testing.T) {
	var gcs, reads, trims atomic.Uint64
	var busy atomic.Bool
	collections := func() uint64 {
		reads.Add(1)
		if busy.Load() {
			return gcs.Add(2) // two collections since the last look: a busy period
		}
		return gcs.Load()
	}
	trim := func() {
		gcs.Add(1) // FreeOSMemory collects
		trims.Add(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { trimIdleMemory(ctx, 5*time.Millisecond, collections, trim) })
	defer func() { cancel(); wg.Wait() }()
	// awaitReads waits for n more looks at the collector (a look per period, two after a trim).
	awaitReads := func(n uint64) {
		target := reads.Load() + n
		retryUntil(t, 10*time.Second, func() error {
			if r := reads.Load(); r < target {
				return fmt.Errorf("%d looks at the collector, waiting for %d", r, target)
			}
			return nil
		})
	}

	// Idle: nothing collected but the trims' own collections, and a trim every period.
	retryUntil(t, 10*time.Second, func() error {
		if n := trims.Load(); n < 3 {
			return fmt.Errorf("%d trims of an idle process, want 3", n)
		}
		return nil
	})
	// Busy: once a whole period has passed under load, no period ends with a trim.
	busy.Store(true)
	awaitReads(3)
	before := trims.Load()
	awaitReads(10)
	if n := trims.Load() - before; n != 0 {
		t.Fatalf("%d trims over ten busy periods", n)
	}
	// Idle again: the trims come back.
	busy.Store(false)
	retryUntil(t, 10*time.Second, func() error {
		if n := trims.Load() - before; n < 2 {
			return fmt.Errorf("%d trims since the load ended, want 2", n)
		}
		return nil
	})
}

// TestGCCycles: the count the trim reads is the runtime's.
func TestGCCycles(t *testing.T) {
	before := gcCycles()
	freeOSMemory()
	if after := gcCycles(); after <= before {
		t.Fatalf("collections %d then %d across a forced collection", before, after)
	}
}
