package sdk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
)

// Handler handles one delivered event. Returning an error retries it with back-off; after
// the consumer's MaxDeliver attempts the sdk terminates the event with the error as its
// reason, and the node writes it to DEAD with that reason.
type Handler func(ctx context.Context, e Event) error

type handler struct {
	pattern string // as the manifest writes it
	subject string // derived subject pattern
	h       Handler
}

// On handles the events matching pattern, written as the manifest writes consumes:
// "billing.order.placed", "*.download.completed", "billing.**" or "**". The pattern must lie
// within one the module declares. The first On starts the module's durable consumer: events
// that arrived while the module was away are delivered now.
func (c *Client) On(pattern string, h Handler) error {
	subject, err := manifest.ConsumeSubject(pattern)
	if err != nil {
		return fmt.Errorf("On(%q): %w", pattern, err)
	}
	self := c.declared()
	declared := false
	for _, p := range self.Consumes {
		if s, err := manifest.ConsumeSubject(p); err == nil && subjectCovers(s, subject) {
			declared = true
			break
		}
	}
	if !declared {
		return fmt.Errorf("%w: module %s does not consume %q (it consumes %v); add it to consumes: in its manifest and re-register",
			ErrNotDeclared, self.Module, pattern, self.Consumes)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handlers = append(c.handlers, handler{pattern: pattern, subject: subject, h: h})
	if c.consume != nil {
		return nil
	}
	ctx, cancel := withDefaultTimeout(c.ctx)
	defer cancel()
	info := manifest.ConsumerInfoSubject(manifest.EventsStreamName, self.Module)
	ctx, stop := c.watch(ctx, info) // a refused lookup fails at once, not at the timeout
	defer stop()
	cons, err := c.js.Consumer(ctx, manifest.EventsStreamName, self.Module)
	if err != nil {
		if r := Refused(ctx); r != nil {
			return fmt.Errorf("open consumer %s on %s: %w", self.Module, manifest.EventsStreamName, r)
		}
		if perr := c.refusal(info); perr != nil {
			return perr
		}
		return fmt.Errorf("open consumer %s on %s: %w", self.Module, manifest.EventsStreamName, err)
	}
	d := &dispatcher{c: c, stream: manifest.EventsStreamName, consumer: self.Module,
		maxDeliver: cons.CachedInfo().Config.MaxDeliver, route: c.route}
	c.consume = c.startConsuming(cons, d, "consumer "+self.Module+" on "+manifest.EventsStreamName)
	return nil
}

// route returns the handler for a delivered subject: the first registered whose pattern
// matches. A seat's event of a later protocol version matches as v1's: the consumer's filter
// already holds only the version the module is pinned to.
func (c *Client) route(subject string) Handler {
	subject = manifest.Unversioned(subject)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.handlers {
		if manifest.Matches(h.subject, subject) {
			return h.h
		}
	}
	return nil
}

// dispatcher runs handlers for one consumer and applies the delivery contract: ack on
// success, NAK with back-off on failure, and on the last delivery give the message up with
// the handler's error as the reason. The node writes the dead letter (DESIGN §3), not the
// sdk: it listens to JetStream's advisories, so a module in any language gets the same.
type dispatcher struct {
	c          *Client
	stream     string
	consumer   string
	maxDeliver int
	route      func(subject string) Handler
	finished   finished // used by run's goroutine alone
}

// finished remembers the stored messages whose handlers a dispatcher completed last. JetStream
// delivers a message again once its ack wait passes, and a copy can arrive while the first is
// handled, or with it after a pause: the copy is acked, not handled again. A message is known
// by its stream sequence and the time the stream stored it (a stream made again numbers its
// messages from 1 again). A NAKed delivery is not finished: its redelivery is the retry. The
// memory is the dispatcher's: a seat held again, or a client started again, begins with none.
type finished struct {
	ring [2 * manifest.MaxAckPending]stored
	next int
	seen map[stored]struct{}
}

// stored names one message of a stream.
type stored struct {
	seq uint64
	at  int64 // Unix nanoseconds
}

func storedOf(md *jetstream.MsgMetadata) stored {
	return stored{seq: md.Sequence.Stream, at: md.Timestamp.UnixNano()}
}

func (f *finished) has(m stored) bool {
	_, ok := f.seen[m]
	return ok
}

func (f *finished) add(m stored) {
	if f.seen == nil {
		f.seen = make(map[stored]struct{}, len(f.ring))
	}
	if f.has(m) {
		return
	}
	delete(f.seen, f.ring[f.next])
	f.ring[f.next] = m
	f.next = (f.next + 1) % len(f.ring)
	f.seen[m] = struct{}{}
}

// handle checks and handles one delivery; pre is its signature's verdict from its batch.
func (d *dispatcher) handle(msg jetstream.Msg, pre verdict) {
	if !d.c.track() {
		return
	}
	defer d.c.wg.Done()
	md, err := msg.Metadata()
	if err != nil {
		d.c.log.Error("delivery without metadata", "subject", msg.Subject(), "err", err)
		return
	}
	copyOf := storedOf(md)
	if d.finished.has(copyOf) {
		if err := msg.Ack(); err != nil {
			d.c.log.Debug("ack a copy of a delivery already handled", "seq", copyOf.seq, "err", err)
		}
		return
	}
	// A replay (`meshnode dead replay`) arrives on a subject for this consumer alone; the
	// event is the one first published on the original subject.
	subject := manifest.Original(msg.Subject())
	e, err := envelope.Read(subject, msg.Headers(), msg.Data())
	if err != nil {
		// A malformed envelope fails every time: no retry can help.
		d.giveUp(msg, md, fmt.Errorf("malformed envelope: %w", err))
		return
	}
	err = d.c.check(d.c.ctx, e, md.Timestamp, subject != msg.Subject(), pre)
	for _, wait := range checkRetry {
		if !errors.Is(err, errTryLater) {
			break
		}
		d.c.log.Warn("cannot check the event's signature now; trying again", "event", e.Key, "id", e.ID, "in", wait, "err", err)
		msg.InProgress()
		select {
		case <-d.c.ctx.Done():
			return // unacked: redelivered to whoever consumes next
		case <-time.After(wait):
		}
		err = d.c.check(d.c.ctx, e, md.Timestamp, subject != msg.Subject(), verdict{})
	}
	switch {
	case errors.Is(err, errTryLater):
		d.c.log.Warn("cannot check the event's signature; it is redelivered", "event", e.Key, "id", e.ID, "err", err)
		msg.NakWithDelay(d.c.retry[0])
		return
	case err != nil:
		d.giveUp(msg, md, err)
		return
	}
	h := d.route(subject)
	if h == nil {
		err = fmt.Errorf("no handler for %s", e.Key)
	} else {
		err = call(d.c.ctx, h, e)
	}
	if err == nil {
		d.finished.add(copyOf)
		if aerr := msg.Ack(); aerr != nil {
			d.c.log.Warn("ack failed; the event will be redelivered", "event", e.ID, "err", aerr)
		}
		return
	}
	if errors.Is(err, ErrShape) {
		d.giveUp(msg, md, err) // no retry makes it fit
		return
	}
	n := int(md.NumDelivered)
	if d.maxDeliver > 0 && n >= d.maxDeliver {
		d.giveUp(msg, md, err)
		return
	}
	delay := d.c.retry[min(n, len(d.c.retry))-1]
	d.c.log.Info("handler failed; retrying", "event", e.Key, "id", e.ID, "delivery", n, "in", delay, "err", err)
	msg.NakWithDelay(delay)
}

// call runs a handler, turning a panic into an error so one bad event cannot kill the module.
func call(ctx context.Context, h Handler, e Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return h(withHandled(ctx, e), e)
}

// giveUp stops the delivery of msg for good: the node sees JetStream's advisory and writes
// the dead letter. On EVENTS the message is terminated with reason, which the dead letter
// keeps as x-dead-reason. A seat's work queue deletes a terminated message before the node
// could read it, so a job is NAKed instead: past MaxDeliver JetStream delivers it no more,
// and its dead letter says "max deliveries" (the reason is in this module's log).
func (d *dispatcher) giveUp(msg jetstream.Msg, md *jetstream.MsgMetadata, reason error) {
	id := msg.Headers().Get(envelope.EventID)
	if d.stream != manifest.EventsStreamName {
		d.c.log.Warn("giving the job up; the node dead-letters it", "subject", msg.Subject(), "id", id,
			"deliveries", md.NumDelivered, "reason", reason)
		if err := msg.Nak(); err != nil {
			d.c.log.Warn("nak failed; the job will be redelivered", "id", id, "err", err)
		}
		return
	}
	if err := msg.TermWithReason(reason.Error()); err != nil {
		d.c.log.Warn("terminate failed; the event will be redelivered", "id", id, "err", err)
		return
	}
	d.c.log.Warn("event given up; the node dead-letters it", "subject", msg.Subject(), "id", id,
		"deliveries", md.NumDelivered, "reason", reason)
}

// subjectCovers reports whether every subject matching b also matches a.
func subjectCovers(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i, tok := range pa {
		if tok == ">" {
			return len(pb) > i
		}
		if i >= len(pb) || pb[i] == ">" {
			return false
		}
		if tok != "*" && (pb[i] == "*" || tok != pb[i]) {
			return false
		}
	}
	return len(pa) == len(pb)
}
