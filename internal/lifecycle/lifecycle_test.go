package lifecycle_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/meshnode/meshnode/internal/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGroup_CloseCancelsAndWaits: Close ends the context every goroutine runs under and
// returns only after each has returned; nothing starts after it, even when asked for
// concurrently with it (run under -race).
func TestGroup_CloseCancelsAndWaits(t *testing.T) {
	g := lifecycle.NewGroup(context.Background())
	var running, ended atomic.Int64
	for range 5 {
		g.Go(func(ctx context.Context) {
			running.Add(1)
			<-ctx.Done()
			ended.Add(1)
		})
	}
	var askers sync.WaitGroup
	var late atomic.Int64
	for range 50 { // callbacks asking while the group closes
		askers.Add(1)
		go func() {
			defer askers.Done()
			g.Go(func(ctx context.Context) { late.Add(1) })
		}()
	}
	g.Close()
	if ended.Load() != running.Load() || running.Load() != 5 {
		t.Fatalf("Close returned with %d of %d goroutines ended", ended.Load(), running.Load())
	}
	after := late.Load()
	askers.Wait()
	if late.Load() != after {
		t.Fatalf("%d goroutines ran after Close returned", late.Load()-after)
	}
	if g.Go(func(context.Context) {}) {
		t.Fatal("Go after Close started a goroutine")
	}
	g.Close() // twice is fine
}

// TestStack_ClosesInReverseAndJoinsErrors: the parts close last first, each once, and every
// error is returned naming its part.
func TestStack_ClosesInReverseAndJoinsErrors(t *testing.T) {
	var s lifecycle.Stack
	var order []string
	broken := errors.New("broken")
	s.PushFunc("store", func() { order = append(order, "store") })
	s.Push("bus", func() error { order = append(order, "bus"); return broken })
	s.PushFunc("http", func() { order = append(order, "http") })
	err := s.Close()
	if !slices.Equal(order, []string{"http", "bus", "store"}) {
		t.Fatalf("closed in order %v, want http, bus, store", order)
	}
	if !errors.Is(err, broken) || err.Error() != "close bus: broken" {
		t.Fatalf("Close: %v, want close bus: broken", err)
	}
	if err := s.Close(); err != nil || len(order) != 3 {
		t.Fatalf("a second Close closed again (%v, %v)", order, err)
	}
}
