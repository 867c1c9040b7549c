package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// holdingSeat is a seat service that says this node holds mesh-controller at epoch 1.
var holdingSeat = Seat{
	List:  func(context.Context) []api.SeatStatus { return nil },
	Epoch: func() uint64 { return 1 },
}

// newTestController is a controller on a plain embedded server, where its tools subscribe,
// with l's loop as its only seat-gated loop; closed when t ends.
func newTestController(t *testing.T, l *loopCounter) *Controller {
	t.Helper()
	nc, _ := testbed.Connect(t, testbed.NATSServer(t, nil))
	c := New(Config{Log: slog.New(slog.DiscardHandler), Node: "alpha", Conn: nc, Responder: nc})
	c.loops = []func(context.Context){l.loop}
	t.Cleanup(func() {
		l.Release() // a failed test's Close must not wait for it
		c.Close()
	})
	return c
}

// loopCounter is a seat-gated loop that counts the sets running and the most that ran at
// once; after its holding ends it waits for release before it returns, as a loop busy with
// a slow request does.
type loopCounter struct {
	started, running, most atomic.Int32
	release                chan struct{}
	releaseOnce            sync.Once
}

func newLoopCounter() *loopCounter { return &loopCounter{release: make(chan struct{})} }

// Release lets the loops of ended holdings return.
func (l *loopCounter) Release() { l.releaseOnce.Do(func() { close(l.release) }) }

func (l *loopCounter) loop(ctx context.Context) {
	n := l.running.Add(1)
	for m := l.most.Load(); n > m && !l.most.CompareAndSwap(m, n); m = l.most.Load() {
	}
	l.started.Add(1)
	<-ctx.Done()
	<-l.release
	l.running.Add(-1)
}

func (l *loopCounter) startedNow(want int32) func() error {
	return func() error {
		if got := l.started.Load(); got != want {
			return fmt.Errorf("%d holdings' loops started, want %d", got, want)
		}
		return nil
	}
}

// TestController_RegainWaitsForLoops: a node that loses the seat and regains it at once,
// while its loops are still ending, starts them again only once they have ended: one set
// at a time.
func TestController_RegainWaitsForLoops(t *testing.T) {
	l := newLoopCounter()
	c := newTestController(t, l)
	if err := c.Start(holdingSeat); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, 10*time.Second, l.startedNow(1))

	c.Stop()
	if err := c.Start(holdingSeat); err != nil {
		t.Fatal(err)
	}
	if got := l.started.Load(); got != 1 {
		t.Fatalf("the second holding's loops started while the first's run: %d sets", got)
	}
	l.Release() // the first holding's loops end now
	testbed.RetryUntil(t, 10*time.Second, l.startedNow(2))
	if got, want := l.most.Load(), int32(1); got != want {
		t.Fatalf("%d sets of loops ran at once, want %d", got, want)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := l.running.Load(); got != 0 {
		t.Fatalf("Close returned with %d loops running", got)
	}
}

// TestController_LetGoBeforeLoopsStart: a holding let go while it waits for the previous
// holding's loops to end starts none.
func TestController_LetGoBeforeLoopsStart(t *testing.T) {
	l := newLoopCounter()
	c := newTestController(t, l)
	if err := c.Start(holdingSeat); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, 10*time.Second, l.startedNow(1))
	c.Stop()
	if err := c.Start(holdingSeat); err != nil {
		t.Fatal(err)
	}
	c.Stop() // let go again before the first holding's loops ended
	l.Release()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := l.started.Load(), int32(1); got != want {
		t.Fatalf("%d holdings' loops started, want %d: a holding let go before its loops began ran them", got, want)
	}
}

// TestController_CloseWaitsForLoops: Close returns once every loop it started has
// returned, and the controller starts nothing after.
func TestController_CloseWaitsForLoops(t *testing.T) {
	l := newLoopCounter()
	l.Release()
	c := newTestController(t, l)
	if err := c.Start(holdingSeat); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, 10*time.Second, l.startedNow(1))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := l.running.Load(); got != 0 {
		t.Fatalf("Close returned with %d loops running", got)
	}
	if err := c.Start(holdingSeat); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v, want %v", err, ErrClosed)
	}
}

// TestLock_LogsALongWait: a wait for the controller's lock longer than slowLock is logged with
// what waited and what held the lock last; a wait within it is not.
func TestLock_LogsALongWait(t *testing.T) {
	var buf testbed.SyncBuffer
	c := &Controller{log: slog.New(slog.NewTextHandler(&buf, nil))}
	defer func(was time.Duration) { slowLock = was }(slowLock)

	slowLock = time.Hour
	c.lock("register")
	c.mu.Unlock()
	if got := buf.String(); got != "" {
		t.Fatalf("a wait within slowLock was logged: %s", got)
	}

	slowLock = -1 // every wait is long
	c.lock("declare every node")
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		c.lock("deploy")
		c.mu.Unlock()
	}()
	c.mu.Unlock()
	<-waited
	got := buf.String()
	for _, want := range []string{"waited for the controller's lock", "for=deploy", `held_by="declare every node"`} {
		if !strings.Contains(got, want) {
			t.Errorf("the log lacks %q:\n%s", want, got)
		}
	}
}
