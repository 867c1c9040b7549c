// Package lifecycle holds the mesh's one pattern for a part's life: a part opens with a
// context and closes by cancelling it and waiting for everything it started (Group), and a
// composition of parts closes in the reverse of the order it opened them (Stack).
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Group runs a part's goroutines under one context. Close cancels the context and waits for
// every goroutine; Go after Close starts nothing, so a goroutine asked for from a callback
// (a NATS handler) cannot race the wait — a bare sync.WaitGroup's Add may not run
// concurrently with a Wait that can see the counter at zero.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// NewGroup returns a group whose context ends when parent's does or at Close.
func NewGroup(parent context.Context) *Group {
	g := &Group{}
	g.ctx, g.cancel = context.WithCancel(parent)
	return g
}

// Context is the group's context: it ends at Close.
func (g *Group) Context() context.Context { return g.ctx }

// Go runs f in a goroutine with the group's context, unless the group is closed; it reports
// whether f was started.
func (g *Group) Go(f func(ctx context.Context)) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f(g.ctx)
	}()
	return true
}

// Close cancels the group's context and waits for its goroutines. It may be called more
// than once.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.cancel()
	g.wg.Wait()
}

// Stack closes what a composition opened, in the reverse order: each step of an open pushes
// how to undo it, so a failed open and a normal close undo the same steps the same way.
type Stack struct {
	mu    sync.Mutex
	steps []step
}

type step struct {
	name  string
	close func() error
}

// Push records how to close the part name; it is closed before everything pushed earlier.
func (s *Stack) Push(name string, close func() error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = append(s.steps, step{name, close})
}

// PushFunc records a close that cannot fail.
func (s *Stack) PushFunc(name string, close func()) {
	s.Push(name, func() error { close(); return nil })
}

// Close closes every part pushed, the last first, each once, and returns their errors
// joined, each naming its part. The stack is empty afterwards.
func (s *Stack) Close() error {
	s.mu.Lock()
	steps := s.steps
	s.steps = nil
	s.mu.Unlock()
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		if err := steps[i].close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", steps[i].name, err))
		}
	}
	return errors.Join(errs...)
}
