package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/outbox"
	"github.com/nats-io/nats.go"
)

// The controller's side of the registry's outbox (registry/outbox.go, package outbox): it
// publishes what a record holds after the change is stored, at start, and every
// outbox.Interval, and removes it from the record once EVENTS acknowledged it.

// flushOutbox publishes the events waiting in module's record, in order, and then writes
// the record without them, or deletes a removed module's record. The caller holds c.mu.
func (c *controller) flushOutbox(ctx context.Context, module string) error {
	e, ok := c.reg.Get(module)
	if !ok {
		e, ok = c.reg.Leaving(module)
	}
	if !ok || (len(e.Outbox) == 0 && !e.Removed) {
		return nil
	}
	sent := 0
	var err error
	for _, ev := range e.Outbox {
		if err = c.publishOutbox(ctx, ev); err != nil {
			break
		}
		sent++
	}
	if sent == 0 && len(e.Outbox) > 0 {
		return err
	}
	rec := e.Record
	rec.Outbox = rec.Outbox[sent:]
	switch {
	case rec.Removed && len(rec.Outbox) == 0:
		if derr := c.reg.Delete(ctx, module, e.Revision); derr != nil {
			return errors.Join(err, fmt.Errorf("the removal of %s was recorded, but its record stays: %w", module, derr))
		}
	default:
		if _, perr := c.reg.Put(ctx, rec, e.Revision); perr != nil {
			// Published, and still in the record: published again later, as the same event.
			return errors.Join(err, fmt.Errorf("events of %s recorded, but the record keeps them: %w", module, perr))
		}
	}
	return err
}

// publishOutbox publishes one waiting event as its node's own, waiting for EVENTS'
// acknowledgement. Published by the node that made the change, it is the same event each
// time (same id, time, signature). Another node — the controller moved after a crash — speaks
// for itself: a new event, caused by the first, naming the node that made the change (if
// that node had published it before it died, the change is recorded twice, never not at all).
func (c *controller) publishOutbox(ctx context.Context, ev outbox.Event) error {
	opts := envelope.Options{ID: ev.ID}
	if ev.Node != c.node {
		opts = envelope.Options{Causation: ev.ID}
	}
	subject := manifest.NodeEventSubject(c.node, ev.Action)
	h, err := envelope.Stamp(c.sign, c.node, c.node, subject, ev.Body, opts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: ev.Body}); err != nil {
		return fmt.Errorf("record %s: %w", ev.Action, err)
	}
	return nil
}

// sweepOutboxes publishes what every record holds until ctx ends (outbox.Sweep).
func (c *controller) sweepOutboxes(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	outbox.Sweep(ctx, c.sweepNow, func(ctx context.Context) (failed bool) {
		for _, e := range c.reg.Pending() {
			fctx, cancel := context.WithTimeout(ctx, controllerTimeout)
			c.mu.Lock()
			err := c.flushOutbox(fctx, e.Module)
			c.mu.Unlock()
			cancel()
			if err != nil {
				c.log.Warn("registry events still waiting in their record; trying again", "module", e.Module, "err", err)
				failed = true
			}
		}
		return failed
	})
}

// flushNow publishes module's waiting events after a change; a failure leaves them to the
// sweep, woken to try again soon. The caller holds c.mu.
func (c *controller) flushNow(ctx context.Context, module string) {
	if err := c.flushOutbox(ctx, module); err != nil {
		c.log.Warn("registry event waits in its record; the sweep tries again", "module", module, "err", err)
		outbox.Wake(c.sweepNow)
	}
}
