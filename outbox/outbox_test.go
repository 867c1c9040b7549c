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

// TestRenew: an event this publisher can send as it is stays; an old one, or another node's,
// becomes a new event naming the first as its cause (the first's cause, if it had one).
func TestRenew(t *testing.T) {
	fresh, _ := outbox.New("rotated", "alpha", map[string]any{"v": 1})
	other, _ := outbox.New("rotated", "beta", map[string]any{"v": 2})
	old := fresh
	old.ID = "01936b2e-1f00-7000-8000-000000000001" // 2024
	old.Cause = "01936b2e-1f00-7000-8000-000000000000"
	got, changed, err := outbox.Renew([]outbox.Event{fresh, other, old}, "alpha")
	if err != nil || !changed || len(got) != 3 {
		t.Fatalf("Renew: %v %v %v", got, changed, err)
	}
	if got[0].ID != fresh.ID || got[0].Cause != "" {
		t.Errorf("a fresh event of this node was renewed: %+v", got[0])
	}
	if got[1].ID == other.ID || got[1].Cause != other.ID || got[1].Node != "alpha" || string(got[1].Body) != string(other.Body) {
		t.Errorf("another node's event: %+v", got[1])
	}
	if got[2].ID == old.ID || got[2].Cause != old.Cause {
		t.Errorf("an old event: %+v, want a new id caused by %s", got[2], old.Cause)
	}
	if _, changed, _ := outbox.Renew([]outbox.Event{fresh}, "alpha"); changed {
		t.Error("nothing to renew, but changed")
	}
	if _, changed, _ := outbox.Renew([]outbox.Event{other}, ""); changed {
		t.Error("with no node, only age renews")
	}
}
