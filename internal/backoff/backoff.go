// Package backoff is how a retry loop waits between attempts: from a first wait, doubling to
// a cap, each wait jittered so that many nodes or clients retrying the same thing do not ask
// in step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the waits of one retry loop. The zero value is not ready: set First and Max.
type Backoff struct {
	First time.Duration // the first wait
	Max   time.Duration // no wait is longer
	next  time.Duration
}

// Next returns the next wait: the current step, less up to a quarter of it at random, and
// doubles the step up to Max.
func (b *Backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = b.First
	}
	step := b.next
	b.next = min(2*b.next, b.Max)
	return step - time.Duration(rand.Int64N(int64(step)/4+1))
}

// Wait waits the next wait, or returns ctx's error if ctx ends first.
func (b *Backoff) Wait(ctx context.Context) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Reset starts the waits again from First, after an attempt succeeded.
func (b *Backoff) Reset() { b.next = 0 }
