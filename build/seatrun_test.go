package build

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestSeatRun_RestartWaits: a seat lost and regained at once starts its new run only once the
// old one has returned, and a run stopped before it began never runs.
func TestSeatRun_RestartWaits(t *testing.T) {
	r := newSeatRun(context.Background())
	var running atomic.Int32
	started := make(chan string, 3)
	release := make(chan struct{})
	run := func(name string, linger bool) func(context.Context) {
		return func(ctx context.Context) {
			if n := running.Add(1); n != 1 {
				t.Errorf("run %s: %d runs at once", name, n)
			}
			started <- name
			<-ctx.Done()
			if linger {
				<-release // the old holding's build still ending
			}
			running.Add(-1)
		}
	}
	r.mu.Lock()
	r.start(run("first", true))
	r.mu.Unlock()
	if got := <-started; got != "first" {
		t.Fatalf("started %s, want first", got)
	}
	r.mu.Lock()
	r.stopRun()
	r.start(run("second", false))
	r.stopRun() // lost again before the first has returned
	r.start(run("third", false))
	r.mu.Unlock()
	select {
	case got := <-started:
		t.Fatalf("%s started while the first run was still ending", got)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if got := <-started; got != "third" {
		t.Fatalf("started %s, want third (second was stopped before it began)", got)
	}
	r.mu.Lock()
	r.close()
	r.mu.Unlock()
	r.wait()
	if n := running.Load(); n != 0 {
		t.Errorf("%d runs left after wait", n)
	}
}
