package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats.go/jetstream"
)

// Job is one piece of work submitted to a seat.
type Job struct {
	Event
	// Seat and Verb say which accept subject the job came on.
	Seat string
	Verb string
	// Epoch is the seat lease's epoch when the job was handed over: the fencing token. A
	// holder that lost the lease can no longer ack; a handler that writes elsewhere can
	// carry the epoch so the writes of a stale holder are recognisable.
	Epoch uint64
}

// JobHandler handles one job. Returning an error retries it with back-off; after MaxDeliver
// attempts it goes to DEAD with the error as its reason.
type JobHandler func(ctx context.Context, j Job) error

// seatState is one seat this instance is a candidate for.
type seatState struct {
	mu       sync.Mutex
	seat     string
	handlers map[string]JobHandler // by verb
	holding  bool
	epoch    uint64
	consume  jetstream.ConsumeContext
}

// Accept handles verb of the seat the module declares that accepts it. The instance becomes a
// candidate for the seat on its node; it consumes only while it holds the seat's lease, which
// the bus enforces: only the holder's connection may pull the seat's queue.
func (c *Client) Accept(verb string, h JobHandler) error {
	self := c.declared()
	var matches []string
	for _, s := range self.Seats {
		if slices.Contains(s.Accepts, verb) {
			matches = append(matches, s.Seat)
		}
	}
	switch len(matches) {
	case 0:
		return fmt.Errorf("%w: no seat of module %s accepts %q; add it to a seat's accepts: and re-register", ErrNotDeclared, self.Module, verb)
	case 1:
		return c.AcceptSeat(matches[0], verb, h)
	}
	return fmt.Errorf("seats %v all accept %q: use AcceptSeat to say which", matches, verb)
}

// AcceptSeat is Accept for a named seat.
func (c *Client) AcceptSeat(seat, verb string, h JobHandler) error {
	self := c.declared()
	i := slices.IndexFunc(self.Seats, func(s seats.Info) bool { return s.Seat == seat })
	if i < 0 {
		return fmt.Errorf("%w: module %s declares no seat %q", ErrNotDeclared, self.Module, seat)
	}
	if !slices.Contains(self.Seats[i].Accepts, verb) {
		return fmt.Errorf("%w: seat %s accepts %v, not %q", ErrNotDeclared, seat, self.Seats[i].Accepts, verb)
	}
	c.mu.Lock()
	if c.seats == nil {
		c.seats = map[string]*seatState{}
	}
	st := c.seats[seat]
	if st == nil {
		st = &seatState{seat: seat, handlers: map[string]JobHandler{}}
		c.seats[seat] = st
	}
	c.mu.Unlock()
	st.mu.Lock()
	st.handlers[verb] = h
	st.mu.Unlock()
	ctx, cancel := withDefaultTimeout(c.ctx)
	defer cancel()
	return c.claim(ctx, st)
}

// Holding reports whether this instance holds seat, and the lease's epoch.
func (c *Client) Holding(seat string) (bool, uint64) {
	c.mu.Lock()
	st := c.seats[seat]
	c.mu.Unlock()
	if st == nil {
		return false, 0
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.holding, st.epoch
}

// claim asks the node to make this instance a candidate for the seat and starts or stops
// consuming according to the answer. The node kicks the connection whenever the instance's
// authority changes; the reconnect claims again, so this converges.
func (c *Client) claim(ctx context.Context, st *seatState) error {
	reply, err := c.seatRequest(ctx, "candidate", st.seat)
	if errors.Is(err, errDropped) {
		c.log.Info("claim interrupted by a reconnect; the reconnect claims again", "seat", st.seat)
		return nil
	}
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !reply.Holder {
		if st.consume != nil {
			st.consume.Stop()
			st.consume = nil
		}
		st.holding = false
		return nil
	}
	if st.holding && st.epoch == reply.Epoch && st.consume != nil {
		return nil
	}
	if st.consume != nil {
		st.consume.Stop()
		st.consume = nil
	}
	info := manifest.ConsumerInfoSubject(reply.Stream, reply.Consumer)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cctx, stop := c.watch(cctx, info)
	defer stop()
	cons, err := c.js.Consumer(cctx, reply.Stream, reply.Consumer)
	if err != nil {
		if Refused(cctx) != nil || c.refusal(info) != nil {
			// The grant has not reached this connection yet: the node kicks it when it
			// does, and the reconnect claims again.
			c.log.Info("seat held, waiting for the holder's grant", "seat", st.seat)
			return nil
		}
		// The node made this instance the holder, but the consumer does not answer yet (a
		// clustered stream electing a leader): keep trying while the client lives.
		c.log.Warn("seat held, its queue does not answer yet; trying again", "seat", st.seat, "err", err)
		c.claimLater(st)
		return nil
	}
	st.holding, st.epoch = true, reply.Epoch
	d := &dispatcher{c: c, stream: reply.Stream, consumer: reply.Consumer,
		maxDeliver: cons.CachedInfo().Config.MaxDeliver, route: st.route}
	st.consume, err = cons.Consume(d.handle, jetstream.PullMaxMessages(manifest.MaxAckPending),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrNoHeartbeat) {
				c.log.Debug("seat consume", "seat", st.seat, "err", err)
			}
		}))
	if err != nil {
		st.holding = false
		return fmt.Errorf("consume seat %s: %w", st.seat, err)
	}
	c.log.Info("holding seat", "seat", st.seat, "epoch", reply.Epoch)
	return nil
}

// errDropped means the connection dropped while a request waited for its answer.
var errDropped = errors.New("the connection dropped before the answer")

// claimLater claims st again after a wait growing from half a second to ten, until a claim
// succeeds or the client closes.
func (c *Client) claimLater(st *seatState) {
	if !c.track() {
		return
	}
	go func() {
		defer c.wg.Done()
		wait := backoff.Backoff{First: 500 * time.Millisecond, Max: 10 * time.Second}
		for {
			if wait.Wait(c.ctx) != nil {
				return
			}
			ctx, cancel := withDefaultTimeout(c.ctx)
			st.mu.Lock()
			waiting := !st.holding
			st.mu.Unlock()
			var err error
			if waiting {
				err = c.claim(ctx, st)
			}
			cancel()
			if err == nil || c.ctx.Err() != nil {
				return
			}
			c.log.Warn("claim seat; trying again", "seat", st.seat, "err", err)
		}
	}()
}

// route finds the handler for a job's subject and wraps it with the current epoch.
func (st *seatState) route(subject string) Handler {
	_, verb, ok := strings.Cut(subject, ".accept.")
	if !ok {
		return nil
	}
	st.mu.Lock()
	h, epoch := st.handlers[verb], st.epoch
	st.mu.Unlock()
	if h == nil {
		return nil
	}
	return func(ctx context.Context, e Event) error {
		return h(ctx, Job{Event: e, Seat: st.seat, Verb: verb, Epoch: epoch})
	}
}

// seatRequest asks this instance's node about one of its seats.
func (c *Client) seatRequest(ctx context.Context, action, seat string) (seats.Reply, error) {
	var reply seats.Reply
	req, _ := json.Marshal(seats.Request{Action: action, Seat: seat, Instance: c.instance})
	subject := manifest.NodeSeatToolSubject(c.node(), c.Module())
	ctx, dropped, end := c.onConnection(ctx)
	defer end()
	ctx, stop := c.watch(ctx, subject)
	defer stop()
	msg, err := c.nc.RequestWithContext(ctx, subject, req)
	if r := Refused(ctx); err != nil && r != nil {
		err = r
	}
	if err != nil && dropped() {
		// The node kicks a new holder's connection to grant it the holder's permissions,
		// sometimes before its answer arrives: the reconnect claims again.
		return reply, fmt.Errorf("ask node %s about seat %s: %w", c.node(), seat, errDropped)
	}
	if err != nil {
		return reply, fmt.Errorf("ask node %s about seat %s: %w", c.node(), seat, err)
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return reply, fmt.Errorf("seat %s: answer %q: %w", seat, msg.Data, err)
	}
	if reply.Error != "" {
		return reply, fmt.Errorf("seat %s: %s", seat, reply.Error)
	}
	return reply, nil
}

// seatStates returns the seats this instance is a candidate for.
func (c *Client) seatStates() []*seatState {
	c.mu.Lock()
	defer c.mu.Unlock()
	sts := make([]*seatState, 0, len(c.seats))
	for _, st := range c.seats {
		sts = append(sts, st)
	}
	return sts
}

// disconnected stops every seat's consuming at once: a holder holds only while connected
// (the node kicks it when the lease is lost), and the reconnect claims again.
func (c *Client) disconnected() {
	c.connMu.Lock()
	c.connEnd() // requests in flight end now: the reconnect claims again
	c.connMu.Unlock()
	for _, st := range c.seatStates() {
		st.mu.Lock()
		if st.consume != nil {
			st.consume.Stop()
			st.consume = nil
		}
		st.holding = false
		st.mu.Unlock()
	}
}

// reclaim claims every seat again after a reconnect.
func (c *Client) reclaim() {
	for _, st := range c.seatStates() {
		ctx, cancel := withDefaultTimeout(c.ctx)
		if err := c.claim(ctx, st); err != nil && c.ctx.Err() == nil {
			c.log.Warn("claim seat after reconnect; trying again", "seat", st.seat, "err", err)
			c.claimLater(st)
		}
		cancel()
	}
}

// releaseSeats stops consuming and releases every seat, so the next candidate takes over at
// once (Close calls it).
func (c *Client) releaseSeats() {
	for _, st := range c.seatStates() {
		st.mu.Lock()
		if st.consume != nil {
			st.consume.Stop()
			st.consume = nil
		}
		holding := st.holding
		st.holding = false
		st.mu.Unlock()
		if holding {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if _, err := c.seatRequest(ctx, "release", st.seat); err != nil {
				c.log.Warn("release seat; it frees when this connection closes", "seat", st.seat, "err", err)
			}
			cancel()
		}
	}
}
