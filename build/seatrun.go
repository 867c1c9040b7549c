package build

import (
	"context"
	"sync"
)

// seatRun is the work of one holding of a seat, restartable: Start begins a run, Stop ends
// it without waiting (Start and Stop run in the lease runner's hooks, which must be quick),
// and a run waits for the one before it, so two never overlap however fast the seat is lost
// and regained. Close ends everything and waits for it.
type seatRun struct {
	ctx    context.Context // from Open to Close: every run and request ends with it
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine started

	mu     sync.Mutex
	closed bool
	stop   context.CancelFunc // ends the current run; nil while the seat is not held
	done   chan struct{}      // closed when the last run started has returned
}

// newSeatRun is a service's runs, ended with ctx or at Close.
func newSeatRun(ctx context.Context) *seatRun {
	r := &seatRun{}
	r.ctx, r.cancel = context.WithCancel(ctx)
	return r
}

// start runs f until stop, after the run before it has returned; r.mu is held.
func (r *seatRun) start(f func(context.Context)) {
	ctx, stop := context.WithCancel(r.ctx)
	prev, done := r.done, make(chan struct{})
	r.stop, r.done = stop, done
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(done)
		if prev != nil {
			<-prev // even when stopped meanwhile: the run after this one waits on done
		}
		if ctx.Err() == nil {
			f(ctx)
		}
	}()
}

// stopRun ends the current run, if any; r.mu is held.
func (r *seatRun) stopRun() {
	if r.stop != nil {
		r.stop()
		r.stop = nil
	}
}

// spawn runs f on a goroutine Close waits for, unless the service is closed.
func (r *seatRun) spawn(f func(ctx context.Context)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f(r.ctx)
	}()
}

// close marks the service closed, after which nothing starts; r.mu is held.
func (r *seatRun) close() { r.closed = true; r.stopRun() }

// wait ends everything started and waits for it.
func (r *seatRun) wait() { r.cancel(); r.wg.Wait() }
