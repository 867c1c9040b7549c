package controller

import (
	"context"
	"fmt"
	"slices"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/outbox"
)

// The controller's side of the registry's outbox (registry/outbox.go, package outbox): the
// sweeper, woken after each change, at start, and every outbox.Interval, publishes what a
// record holds and takes it out once EVENTS acknowledged it.

// flushOutbox publishes the events waiting in module's record (outbox.Flush), renewing
// what this node cannot publish as it is (another node's events, or old ones), and deletes
// a removed module's record once none is left. The record is written under c.mu, the
// publishes made without it, so a slow EVENTS never holds up registrations.
func (c *Controller) flushOutbox(ctx context.Context, module string) error {
	edit := func(ctx context.Context, f func([]outbox.Event) ([]outbox.Event, bool, error)) ([]outbox.Event, error) {
		return c.editOutbox(ctx, module, f)
	}
	if err := outbox.Flush(ctx, c.node, edit, c.publishOutbox); err != nil {
		return fmt.Errorf("module %s: %w", module, err)
	}
	return nil
}

// editOutbox writes module's record with the outbox edit returns when edit says it changed
// it, and deletes a removed module's record whose outbox is empty, under c.mu; it returns the
// outbox the record then holds.
func (c *Controller) editOutbox(ctx context.Context, module string, edit func([]outbox.Event) ([]outbox.Event, bool, error)) ([]outbox.Event, error) {
	c.lock("outbox")
	defer c.mu.Unlock()
	e, ok := c.reg.Get(module)
	if !ok {
		e, ok = c.reg.Leaving(module)
	}
	if !ok {
		return nil, nil
	}
	events, changed, err := edit(slices.Clone(e.Outbox))
	if err != nil {
		return nil, err
	}
	if e.Removed && len(events) == 0 {
		if err := c.reg.Delete(ctx, module, e.Revision); err != nil {
			return nil, fmt.Errorf("the removal of %s was recorded, but its record stays: %w", module, err)
		}
		return nil, nil
	}
	if !changed {
		return events, nil
	}
	rec := e.Record
	rec.Outbox = events
	if _, err := c.reg.Put(ctx, rec, e.Revision); err != nil {
		return nil, err
	}
	return events, nil
}

// publishOutbox publishes one waiting event as this node's own, waiting for EVENTS'
// acknowledgement: the same event each time it is tried (same id, time, signature), since
// outbox.Renew gave this node an event of its own for what another node made.
func (c *Controller) publishOutbox(ctx context.Context, ev outbox.Event) error {
	return outbox.Publish(ctx, c.js, c.sign, c.node, c.node, manifest.NodeEventSubject(c.node, ev.Action), ev)
}

// sweepOutboxes publishes what every record holds until ctx ends (outbox.Sweep).
func (c *Controller) sweepOutboxes(ctx context.Context) {
	outbox.Sweep(ctx, c.sweepNow, func(ctx context.Context) (failed bool) {
		for _, e := range c.reg.Pending() {
			if ctx.Err() != nil {
				return false
			}
			fctx, cancel := context.WithTimeout(ctx, controllerTimeout)
			err := c.flushOutbox(fctx, e.Module)
			cancel()
			if err != nil {
				c.log.Warn("registry events still waiting in their record; trying again", "module", e.Module, "err", err)
				failed = true
			}
		}
		return failed
	})
}
