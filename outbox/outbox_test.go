package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/outbox"
)

func TestNewAndCheck(t *testing.T) {
	e, err := outbox.New("rotated", "alpha", map[string]any{"version": 2})
	if err != nil {
		t.Fatal(err)
	}
	known := func(a string) bool { return a == "rotated" }
	if err := outbox.Check([]outbox.Event{e}, known); err != nil {
		t.Fatalf("a new event: %v", err)
	}
	bad := e
	bad.Node = "Not A Node"
	for name, c := range map[string]struct {
		events []outbox.Event
		want   string
	}{
		"unknown action": {[]outbox.Event{{ID: e.ID, Action: "deleted", Body: e.Body}}, "not one of"},
		"bad node":       {[]outbox.Event{bad}, "not a name"},
		"too many":       {make([]outbox.Event, outbox.Max+1), "more than"},
	} {
		if err := outbox.Check(c.events, known); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

// TestSweep: it sweeps at once, again soon after a failure, and when woken; it ends with
// its context.
func TestSweep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	wake := make(chan struct{}, 1)
	var n atomic.Int32
	swept := make(chan int32, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		outbox.Sweep(ctx, wake, func(context.Context) bool {
			i := n.Add(1)
			swept <- i
			return i == 1 // the first fails: the second follows after FirstRetry, not Interval
		})
	}()
	next := func(within time.Duration) int32 {
		select {
		case i := <-swept:
			return i
		case <-time.After(within):
			t.Fatal(errors.New("no sweep"))
			return 0
		}
	}
	next(time.Second)
	next(outbox.FirstRetry + time.Second)
	outbox.Wake(wake)
	outbox.Wake(wake) // never blocks
	next(time.Second)
	cancel()
	<-done
}
