//go:build integration

package node_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
)

// churn opens and closes n connections of the module whose seed is in seedFile, workers at
// a time, each connect authenticated by the node and flushed once.
func churn(url, seedFile, module string, n, workers int) error {
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		return err
	}
	jobs := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				nc, err := nats.Connect(url, opt, nats.CustomInboxPrefix(manifest.InboxPrefix(module)), nats.NoReconnect())
				if err == nil {
					err = nc.Flush()
					nc.Close()
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var first error
	for i := 0; i < n && first == nil; i++ {
		select {
		case jobs <- i:
		case first = <-errs:
		}
	}
	close(jobs)
	wg.Wait()
	if first == nil && len(errs) > 0 {
		first = <-errs
	}
	return first
}

// heapAfterGC is the live heap of this process, the node's included, after collecting: the
// least of three readings, so that what a periodic task of the node holds for a moment (a
// snapshot, a batch) is not taken for what it keeps.
func heapAfterGC() uint64 {
	least := uint64(0)
	for range 3 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		if least == 0 || m.HeapAlloc < least {
			least = m.HeapAlloc
		}
	}
	return least
}

// TestIntegration_ConnectionsLeaveNothing: opening and closing 10,000 connections leaves
// nothing of them in the node. The first round fills what the server keeps by design
// (its ring of closed connections, MaxClosedClients, 10,000 by default); after two more
// rounds of 10,000 the heap is back where the first left it, so nothing grows with the
// connections a node has ever had.
func TestIntegration_ConnectionsLeaveNothing(t *testing.T) {
	const connections, workers = 10_000, 32
	b := newBed(t)
	seed, _ := b.register("module: churn\nrequires: [mesh-bus]\n")
	base := b.n.Bus().Stats().Connections
	round := func() uint64 {
		start := time.Now()
		if err := churn(b.n.ClientURL(), seed, "churn", connections, workers); err != nil {
			t.Fatalf("open and close %d connections: %v", connections, err)
		}
		retryUntil(t, 10*time.Second, func() error {
			if n := b.n.Bus().Stats().Connections; n != base {
				return fmt.Errorf("%d connections open, %d before the round", n, base)
			}
			return nil
		})
		heap := heapAfterGC()
		t.Logf("%d connections opened and closed in %v; heap %.1f MiB", connections, time.Since(start).Round(time.Millisecond), float64(heap)/(1<<20))
		return heap
	}
	baseline := round()
	round()
	after := round()
	// A leak of even 30 bytes a connection is 600 KB over two rounds. The heap of a node that
	// keeps nothing moves between rounds by what its periodic work holds at the time:
	// -325 to +79 KiB in three runs on an idle machine, +348 KiB once in CI.
	const slack = 512 << 10
	t.Logf("heap after the third round minus after the first: %+d KiB", (int64(after)-int64(baseline))/1024)
	if after > baseline+slack {
		t.Fatalf("the heap grew by %.2f MiB over 20,000 connections that are all closed (%.0f bytes each): something keeps per-connection state",
			float64(after-baseline)/(1<<20), float64(after-baseline)/(2*connections))
	}
}
