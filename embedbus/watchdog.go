package embedbus

import (
	"fmt"
	"log/slog"
	"runtime"
	"time"
)

// A damaged store can make nats-server's JetStream restore run for minutes and grow without
// bound (a corrupted EVENTS block once took a node to 6.6 GB with no log line). Start-up is
// therefore watched: every WatchInterval the node says what it is still doing and how much
// memory it holds, and past StartMemoryLimit it gives up with the reason.

// Defaults of the start-up watchdog.
const (
	// DefaultWatchInterval is how often a start that has not finished says so.
	DefaultWatchInterval = 5 * time.Second
	// DefaultStartMemoryLimit bounds the Go heap while the server starts: far above what a
	// healthy restore needs (the store is read block by block), far below a machine's RAM.
	DefaultStartMemoryLimit = 4 << 30
)

// ErrStartMemory means the server's start grew past the memory limit: its store is likely
// damaged.
type ErrStartMemory struct {
	Limit, Heap uint64
	StoreDir    string
	Elapsed     time.Duration
}

func (e *ErrStartMemory) Error() string {
	return fmt.Sprintf("nats-server's start used %d MiB of memory after %s, over the %d MiB limit, while restoring JetStream from %s: a stream's files there are probably damaged; move the stream's directory aside (jetstream/<account>/streams/<stream>) and start again, or raise the limit",
		e.Heap>>20, e.Elapsed.Round(time.Second), e.Limit>>20, e.StoreDir)
}

// watchStart logs the start's progress every interval until done is closed, and calls
// exceeded (once) if the heap grows past limit.
func watchStart(log *slog.Logger, storeDir string, interval time.Duration, limit uint64, exceeded func(error), done <-chan struct{}) {
	start := time.Now()
	tick := time.NewTicker(min(interval, 250*time.Millisecond))
	defer tick.Stop()
	lastLog := start
	var ms runtime.MemStats
	for first := true; ; first = false {
		if !first {
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
		runtime.ReadMemStats(&ms)
		if limit > 0 && ms.HeapAlloc > limit {
			err := &ErrStartMemory{Limit: limit, Heap: ms.HeapAlloc, StoreDir: storeDir, Elapsed: time.Since(start)}
			log.Error("start-up over its memory limit", "err", err)
			if exceeded != nil {
				exceeded(err)
			}
			return
		}
		if time.Since(lastLog) >= interval {
			lastLog = time.Now()
			log.Warn("nats-server is still starting: restoring JetStream's streams from the store",
				"store", storeDir, "elapsed", time.Since(start).Round(time.Second), "heap_mib", ms.HeapAlloc>>20)
		}
	}
}
