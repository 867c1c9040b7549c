package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestNext_DoublesToTheCapWithJitter: each wait is its step less at most a quarter; steps
// double from First and stop at Max; Reset starts again from First.
func TestNext_DoublesToTheCapWithJitter(t *testing.T) {
	b := Backoff{First: 100 * time.Millisecond, Max: time.Second}
	steps := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for round := range 2 {
		for i, step := range steps {
			step *= time.Millisecond
			got := b.Next()
			if got > step || got < step-step/4 {
				t.Errorf("round %d, wait %d: %v, want within [%v, %v]", round, i, got, step-step/4, step)
			}
		}
		b.Reset()
	}
}

// TestWait_EndsWithTheContext: a wait gives way to its context's end.
func TestWait_EndsWithTheContext(t *testing.T) {
	b := Backoff{First: time.Hour, Max: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on an ended context: %v, want context.Canceled", err)
	}
	short := Backoff{First: time.Millisecond, Max: time.Millisecond}
	if err := short.Wait(context.Background()); err != nil {
		t.Fatalf("Wait of a millisecond: %v", err)
	}
}
