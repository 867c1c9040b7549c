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

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/toolstats"
	"github.com/nats-io/nats.go"
)

// Job is one piece of work submitted to a seat.
type Job struct {
	Event
	// Seat and Verb say which accept subject the job came on; Version which version of the
	// seat's protocol it was sent in ("" for v1).
	Seat    string
	Verb    string
	Version string
	// Epoch is the seat lease's epoch when the job was handed over: the fencing token. A
	// holder that lost the lease can no longer ack; a handler that writes elsewhere can
	// carry the epoch so the writes of a stale holder are recognisable.
	Epoch uint64
}

// JobHandler handles one job. Returning an error retries it with back-off; after MaxDeliver
// attempts it goes to DEAD with the error as its reason.
type JobHandler func(ctx context.Context, j Job) error

// seatState is one seat this instance is a candidate for, or gathers handlers to be.
type seatState struct {
	mu       sync.Mutex
	seat     string
	info     api.SeatInfo           // the seat's protocol, as declared
	handlers map[string]JobHandler  // by versioned(version, verb)
	tools    map[string]ToolHandler // by versioned(version, tool)
	holding  bool
	epoch    uint64
	consume  *consumption
	toolSubs []*nats.Subscription // the served tools' subscriptions, while holding
}

// accepts refuses a verb the seat does not accept: for a holder and for a sender.
func accepts(info api.SeatInfo, verb string) error {
	if !slices.Contains(info.Accepts, verb) {
		return fmt.Errorf("%w: seat %s accepts %v, not %q", ErrNotDeclared, info.Seat, info.Accepts, verb)
	}
	return nil
}

// serves refuses a tool the seat does not serve: for a holder and for a caller.
func serves(info api.SeatInfo, tool string) error {
	if slices.Contains(info.Serves, tool) {
		return nil
	}
	if info.Version == "" || info.Version == manifest.V1 {
		return fmt.Errorf("%w: seat %s serves %v, not %q", ErrNotDeclared, info.Seat, info.Serves, tool)
	}
	return fmt.Errorf("%w: seat %s's %s serves %v, not %q", ErrNotDeclared, info.Seat, info.Version, info.Serves, tool)
}

// callable is serves for a module that uses the seat: a later version is the one it is
// pinned to, which may serve less than v1.
func callable(info api.SeatInfo, tool string) error {
	err := serves(info, tool)
	if err != nil && info.Version != "" && info.Version != manifest.V1 {
		return fmt.Errorf("%w (the version this module is pinned to; `meshnode seat ls` shows the versions, `meshnode seat pin` moves a module to another)", err)
	}
	return err
}

// versioned is the key of a verb or tool of a version of a seat's protocol in seatState's
// maps: the name itself for v1, "<version> <name>" for a later one.
func versioned(version, name string) string {
	if version == "" || version == manifest.V1 {
		return name
	}
	return version + " " + name
}

// versions returns the seat's protocol versions, v1 first, each as Info.
func versions(info api.SeatInfo) []api.SeatInfo {
	v1, _ := info.At(manifest.V1)
	return append([]api.SeatInfo{v1}, info.Versions...)
}

// missing lists the verbs and tools of the seat's protocol — every version of it — without a
// handler ("accepts send", "v2 serves status"), under st.mu.
func (st *seatState) missing() []string {
	var out []string
	for _, v := range versions(st.info) {
		for _, verb := range v.Accepts {
			if st.handlers[versioned(v.Version, verb)] == nil {
				out = append(out, versioned(v.Version, "accepts "+verb))
			}
		}
		for _, t := range v.Serves {
			if st.tools[versioned(v.Version, t)] == nil {
				out = append(out, versioned(v.Version, "serves "+t))
			}
		}
	}
	return out
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
//
// A holder implements its seat's whole protocol (DESIGN §7): the instance claims the seat
// only once every verb the seat accepts and every tool it serves has a handler (AcceptSeat,
// ServeSeat, or all at once with HoldSeat). Until then AcceptSeat keeps the handler and
// returns nil without claiming; Missing says what is still to set.
func (c *Client) AcceptSeat(seat, verb string, h JobHandler) error {
	st, err := c.seatFor(seat)
	if err != nil {
		return err
	}
	if err := accepts(st.info, verb); err != nil {
		return err
	}
	st.mu.Lock()
	st.handlers[verb] = h
	st.mu.Unlock()
	return c.claimWhenComplete(st)
}

// ServeSeat answers tool of a seat the module declares, from this instance while it holds
// the seat (only the holder may subscribe to the seat's tools: the bus enforces it). Like
// AcceptSeat, it claims the seat once the whole protocol has handlers.
func (c *Client) ServeSeat(seat, tool string, h ToolHandler) error {
	st, err := c.seatFor(seat)
	if err != nil {
		return err
	}
	if err := serves(st.info, tool); err != nil {
		return err
	}
	st.mu.Lock()
	st.tools[tool] = h
	var serr error
	if st.holding {
		serr = c.serveSeatTools(st) // a tool added while holding is served at once
	}
	st.mu.Unlock()
	if serr != nil {
		return serr
	}
	return c.claimWhenComplete(st)
}

// SeatHandlers are the handlers of a seat's whole protocol: v1's, and each later version's.
type SeatHandlers struct {
	Accepts map[string]JobHandler  // by verb
	Serves  map[string]ToolHandler // by tool
	// Versions are the handlers of the seat's later protocol versions, by version (v2 …),
	// which the holder serves beside v1 (their own Versions are ignored).
	Versions map[string]SeatHandlers
}

// HoldSeat sets the handlers of seat's whole protocol — every version of it — at once and
// claims it; a verb or tool without a handler is an ErrIncomplete naming it, and nothing is
// claimed.
func (c *Client) HoldSeat(seat string, h SeatHandlers) error {
	st, err := c.seatFor(seat)
	if err != nil {
		return err
	}
	all := map[string]SeatHandlers{manifest.V1: {Accepts: h.Accepts, Serves: h.Serves}}
	for v, vh := range h.Versions {
		all[v] = vh
	}
	for version, vh := range all {
		info, ok := st.info.At(version)
		if !ok {
			return fmt.Errorf("%w: seat %s has no protocol version %q (it has %v)", ErrNotDeclared, seat, version, versionNames(st.info))
		}
		for v := range vh.Accepts {
			if err := accepts(info, v); err != nil {
				return err
			}
		}
		for t := range vh.Serves {
			if err := serves(info, t); err != nil {
				return err
			}
		}
	}
	st.mu.Lock()
	for version, vh := range all {
		for v, f := range vh.Accepts {
			st.handlers[versioned(version, v)] = f
		}
		for t, f := range vh.Serves {
			st.tools[versioned(version, t)] = f
		}
	}
	missing := st.missing()
	st.mu.Unlock()
	if len(missing) > 0 {
		return fmt.Errorf("%w: seat %s lacks handlers for %s", ErrIncomplete, seat, strings.Join(missing, ", "))
	}
	return c.claimWhenComplete(st)
}

// Missing lists what seat's protocol still lacks a handler for ("accepts send",
// "serves status"): while it is not empty, the instance does not claim the seat.
func (c *Client) Missing(seat string) []string {
	c.mu.Lock()
	st := c.seats[seat]
	c.mu.Unlock()
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.missing()
}

// seatFor returns the state of a seat the module declares, made on first use.
func (c *Client) seatFor(seat string) (*seatState, error) {
	self := c.declared()
	i := slices.IndexFunc(self.Seats, func(s api.SeatInfo) bool { return s.Seat == seat })
	if i < 0 {
		return nil, fmt.Errorf("%w: module %s declares no seat %q", ErrNotDeclared, self.Module, seat)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seats == nil {
		c.seats = map[string]*seatState{}
	}
	st := c.seats[seat]
	if st == nil {
		st = &seatState{seat: seat, info: self.Seats[i], handlers: map[string]JobHandler{}, tools: map[string]ToolHandler{}}
		c.seats[seat] = st
	}
	return st, nil
}

// claimWhenComplete claims st once its whole protocol has handlers.
func (c *Client) claimWhenComplete(st *seatState) error {
	st.mu.Lock()
	missing := st.missing()
	st.mu.Unlock()
	if len(missing) > 0 {
		c.log.Info("seat not claimed until its whole protocol has handlers", "seat", st.seat, "missing", missing)
		return nil
	}
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
		st.letGo()
		return nil
	}
	if st.holding && st.epoch == reply.Epoch && (st.consume != nil || reply.Stream == "") {
		return nil
	}
	st.letGo()
	if reply.Stream == "" {
		// A seat that accepts nothing has no queue: holding it is serving its tools and
		// emitting its events.
		if err := c.serveSeatTools(st); err != nil {
			return err
		}
		st.holding, st.epoch = true, reply.Epoch
		c.log.Info("holding seat", "seat", st.seat, "epoch", reply.Epoch)
		return nil
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
	st.consume = c.startConsuming(cons, d, "seat "+st.seat+"'s queue")
	if err := c.serveSeatTools(st); err != nil {
		st.letGo()
		return err
	}
	c.log.Info("holding seat", "seat", st.seat, "epoch", reply.Epoch)
	return nil
}

// letGo stops consuming and serving st: the instance no longer holds it. Under st.mu.
func (st *seatState) letGo() {
	if st.consume != nil {
		st.consume.Stop()
		st.consume = nil
	}
	for _, sub := range st.toolSubs {
		sub.Unsubscribe()
	}
	st.toolSubs = nil
	st.holding = false
}

// serveSeatTools subscribes the seat's tools — of every version — that have a handler and no
// subscription yet, in the seat's queue group. Under st.mu.
func (c *Client) serveSeatTools(st *seatState) error {
	for _, v := range versions(st.info) {
		for _, tool := range v.Serves {
			h := st.tools[versioned(v.Version, tool)]
			subject := manifest.SeatToolSubjectAt(st.seat, v.Version, tool)
			if h == nil || slices.ContainsFunc(st.toolSubs, func(s *nats.Subscription) bool { return s.Subject == subject }) {
				continue
			}
			if shape := v.Shapes[tool]; shape != nil {
				h = shapedTool(shape, "seat "+st.seat+" "+versioned(v.Version, "tool "+tool), h)
			}
			sub, err := c.nc.QueueSubscribe(subject, st.seat, c.toolResponder(tool, toolstats.SeatTool(st.seat, tool), h))
			if err != nil {
				return fmt.Errorf("serve %s of seat %s: %w", versioned(v.Version, tool), st.seat, err)
			}
			st.toolSubs = append(st.toolSubs, sub)
		}
	}
	return c.nc.Flush()
}

// versionNames lists the versions info describes: v1 and its later ones.
func versionNames(info api.SeatInfo) []string {
	out := []string{manifest.V1}
	for _, v := range info.Versions {
		out = append(out, v.Version)
	}
	return out
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

// route finds the handler for a job's subject (of any version of the seat's protocol) and
// wraps it with the current epoch.
func (st *seatState) route(subject string) Handler {
	ss, ok := manifest.ParseSeatSubject(subject)
	if !ok || ss.Kind != "accept" || ss.Seat != st.seat {
		return nil
	}
	version, verb := ss.Version, ss.Name
	if version == manifest.V1 {
		version = ""
	}
	st.mu.Lock()
	h, epoch := st.handlers[versioned(version, verb)], st.epoch
	info, _ := st.info.At(version)
	st.mu.Unlock()
	if h == nil {
		return nil
	}
	shape := info.Shapes[verb]
	return func(ctx context.Context, e Event) error {
		// A job that does not fit its verb's shape fails every time: it is given up at once.
		if err := checkShape(shape, "seat "+st.seat+" "+versioned(version, "accept "+verb), e.Data); err != nil {
			return err
		}
		return h(ctx, Job{Event: e, Seat: st.seat, Verb: verb, Version: version, Epoch: epoch})
	}
}

// seatRequest asks this instance's node about one of its seats.
func (c *Client) seatRequest(ctx context.Context, action, seat string) (api.SeatReply, error) {
	var reply api.SeatReply
	req, _ := json.Marshal(api.SeatRequest{Action: action, Seat: seat, Instance: c.instance})
	subject := manifest.NodeSeatToolSubject(c.node(), c.Module())
	ctx, _, dropped, end := c.waitContext(ctx, subject)
	defer end()
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
		st.letGo()
		st.mu.Unlock()
	}
}

// reclaim claims every seat again after a reconnect (those whose protocol has handlers).
func (c *Client) reclaim() {
	for _, st := range c.seatStates() {
		st.mu.Lock()
		incomplete := len(st.missing()) > 0
		st.mu.Unlock()
		if incomplete {
			continue
		}
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
		holding := st.holding
		st.letGo()
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

// shapedTool answers a request that does not fit the tool's shape with ErrShape, without
// calling h.
func shapedTool(shape *manifest.Shape, what string, h ToolHandler) ToolHandler {
	return func(ctx context.Context, r Request) ([]byte, error) {
		if err := checkShape(shape, what, r.Data); err != nil {
			return nil, err
		}
		return h(ctx, r)
	}
}
