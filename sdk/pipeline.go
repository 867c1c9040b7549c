package sdk

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// MaxInFlight bounds the events EmitAsync has sent and JetStream has not answered yet: past
// it, EmitAsync waits for an answer (or its context) before it sends the next.
const MaxInFlight = 1024

// MaxInFlightBytes bounds the bytes of the events EmitAsync has sent and JetStream has not
// answered yet, as MaxInFlight bounds their number. What a module pipelines passes through its
// node's admitter, which the server cuts off (every module's emits meanwhile go unanswered
// until it is back) once 64 MiB wait for it: 1,024 events of 1 MB in flight were 1 GB, and a
// module pipelining them cut the admitter in a local CI run. At 8 MiB a pipeline of 1 MB
// events still has eight in flight, and one of small events is bounded by their number.
const MaxInFlightBytes = 8 << 20

// asyncAckTimeout is how long an event EmitAsync sent waits for JetStream's answer before it
// is reported as failed (it may still have been stored: Retry(id) makes trying again safe).
const asyncAckTimeout = 10 * time.Second

// Pending is an event EmitAsync sent: its id at once, JetStream's answer when it comes.
type Pending struct {
	id   string
	done chan struct{}
	err  error
	// Retries after the admitter's retryable refusals (pipeline.retry), within
	// resendWithin of sent.
	sent     time.Time
	size     int64     // what it holds of the pipeline's MaxInFlightBytes
	away     time.Time // when a send first met no responder (admitterAwayFor)
	attempts int
	last     time.Time // when its last attempt was sent (or is to be)
}

// ID is the event's x-event-id.
func (p *Pending) ID() string { return p.id }

// Done is closed when JetStream has answered (or the wait for it ended): then Err is the
// outcome.
func (p *Pending) Done() <-chan struct{} { return p.done }

// Err is nil once the event is stored, the reason it is not otherwise; nil also while it is
// not Done.
func (p *Pending) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Wait waits until the event is Done, or ctx ends, and returns Err.
func (p *Pending) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("event %s: %w", p.id, ctx.Err())
	}
}

// pipeline is the client's pipelined publishing: one JetStream context whose answers are
// handed back here, the events in flight by message, and the failures Flush reports.
type pipeline struct {
	once  sync.Once
	used  atomic.Bool // once EmitAsync was called
	js    jetstream.JetStream
	slots chan struct{}       // one per event in flight
	bytes *semaphore.Weighted // the bytes in flight, MaxInFlightBytes at most

	mu       sync.Mutex
	inflight map[*nats.Msg]*Pending
	// The pipeline's back-off after the admitter's retryable refusals (retryAsync): nothing
	// is sent before resume, and each refusal in a row doubles the pause. One pause for the
	// whole pipeline, not one per event: a thousand events in flight each retrying on its
	// own clock were tens of thousands of messages a second, and the node bars a
	// connection that sends so many.
	resume  time.Time
	refused int       // pauses in a row: each doubles the last
	refusal time.Time // the last refusal: a second without one starts the pauses over
	// Past its pace (a refusal 19003) the pipeline sends at the pace the refusal names
	// (keepTo), or, from an admitter that names none, at the rate the node stored its events
	// over the last second (slowTo), instead of sending its whole window again after each
	// pause: a paced module is refused about once for each event of its first window, not
	// thousands of times a second, and the node can tell it from a flooder. A named pace is
	// kept until toldFor passes without a refusal; a measured one doubles every second
	// without a refusal, and is gone once past any node's pace.
	pace    *rate.Limiter
	paceAt  time.Time     // when pace last changed
	told    bool          // pace is the node's, as its refusal named it (keepTo)
	stored  ackRate       // the events stored in the last second
	drained chan struct{} // closed when inflight empties; nil while nobody waits
	failed  []error       // since the last Flush
}

// EmitAsync publishes one of the module's declared events as Emit does, without waiting for
// JetStream's answer: it returns once the event is sent, with its x-event-id and a Pending
// that reports the answer. At most MaxInFlight events, and MaxInFlightBytes of them, are
// unanswered at once; past that EmitAsync waits, within ctx, for room. Flush waits for every
// answer and reports the events that were not stored. The event is signed before EmitAsync
// returns.
func (c *Client) EmitAsync(ctx context.Context, event string, payload any, opts ...EmitOption) (*Pending, error) {
	subject, err := c.emitSubject(event)
	if err != nil {
		return nil, err
	}
	h, body, err := c.stamp(ctx, c.Module(), subject, payload, opts)
	if err != nil {
		return nil, err
	}
	pl := c.pipelined()
	if err := pl.paused(ctx); err != nil {
		return nil, fmt.Errorf("EmitAsync %s: the mesh asked to slow down: %w", event, err)
	}
	select {
	case pl.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("EmitAsync %s: %d events unanswered, waiting for a slot: %w", event, MaxInFlight, ctx.Err())
	}
	msg := &nats.Msg{Subject: manifest.AdmitSubject(c.Module(), subject), Header: h, Data: body}
	size := min(envelope.StoredSize(msg.Subject, msg.Header, msg.Data), MaxInFlightBytes)
	if err := pl.bytes.Acquire(ctx, size); err != nil {
		<-pl.slots
		return nil, fmt.Errorf("EmitAsync %s: up to %d bytes of events unanswered, waiting for room: %w", event, MaxInFlightBytes, err)
	}
	now := time.Now()
	p := &Pending{id: h.Get(envelope.EventID), done: make(chan struct{}), sent: now, size: size, last: now}
	pl.mu.Lock()
	pl.inflight[msg] = p
	pl.mu.Unlock()
	if _, err := pl.js.PublishMsgAsync(msg, noRetry); err != nil {
		err = fmt.Errorf("publish %s (event %s): %w", subject, p.id, err)
		c.answered(msg, err)
		return nil, err
	}
	return p, nil
}

// Flush waits until JetStream has answered every event EmitAsync sent, or ctx ends, and
// returns the failures since the last Flush, joined: each names its event's id, which
// Retry(id) sends again safely.
func (c *Client) Flush(ctx context.Context) error {
	if err := c.flushAnswers(ctx); err != nil {
		return errors.Join(err, c.failures())
	}
	return c.failures()
}

// flushAnswers waits until nothing EmitAsync sent is unanswered, or ctx ends.
func (c *Client) flushAnswers(ctx context.Context) error {
	pl := c.pipelined()
	for {
		pl.mu.Lock()
		if len(pl.inflight) == 0 {
			pl.mu.Unlock()
			return nil
		}
		if pl.drained == nil {
			pl.drained = make(chan struct{})
		}
		drained := pl.drained
		pl.mu.Unlock()
		select {
		case <-drained:
		case <-ctx.Done():
			pl.mu.Lock()
			n := len(pl.inflight)
			pl.mu.Unlock()
			return fmt.Errorf("flush: %d events not answered yet: %w", n, ctx.Err())
		}
	}
}

// pipelined returns the client's pipeline, made on first use.
func (c *Client) pipelined() *pipeline {
	pl := &c.pipeline
	pl.once.Do(func() {
		pl.slots = make(chan struct{}, MaxInFlight)
		pl.bytes = semaphore.NewWeighted(MaxInFlightBytes)
		pl.mu.Lock()
		pl.inflight = map[*nats.Msg]*Pending{}
		pl.mu.Unlock()
		pl.js, _ = jetstream.New(c.nc,
			// The slots bound what is in flight; nats.go's own bound is wider, so it never
			// stalls a slot's holder.
			jetstream.WithPublishAsyncMaxPending(2*MaxInFlight),
			jetstream.WithPublishAsyncTimeout(asyncAckTimeout),
			jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
				c.answered(m, nil)
			}),
			jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
				if !c.retryAsync(m, err) {
					c.answered(m, c.asyncEmitError(m, err))
				}
			}))
		pl.used.Store(true)
	})
	return pl
}

// retryAsync sends m again after a back-off, and reports whether it will: after the admitter's
// retryable refusal, if m's event was first sent less than resendWithin ago; after no
// responder (the admitter away), within admitterAwayFor of the first. The event keeps its
// slot meanwhile, so a refused pipeline slows down instead of piling up. A refusal is an
// answer — the node is there, and stored nothing — so the bound is not asyncAckTimeout's:
// 2,000 events pushed at once into a pace of 300 a second keep their last ones waiting for
// seconds, longer than 10 on a loaded machine.
func (c *Client) retryAsync(m *nats.Msg, err error) bool {
	refusal, refused := admitRefusal(err)
	absent := !refused && jsretry.Leaderless(err) // the node's admitter away (admitterAwayFor)
	if !absent && (!refused || !api.AdmitRetryable(refusal.code)) {
		return false
	}
	pl := &c.pipeline
	pl.mu.Lock()
	p := pl.inflight[m]
	// An event away from its admitter is sent again for admitterAwayFor whenever it was
	// first sent: every send before was answered (a timeout is final here), so none was
	// stored.
	if p == nil || (!absent && time.Since(p.sent) > resendWithin) {
		pl.mu.Unlock()
		return false
	}
	switch {
	case !absent:
		p.away = time.Time{} // an answer: the admitter was there
	case p.away.IsZero():
		p.away = time.Now()
	case time.Since(p.away) > admitterAwayFor:
		pl.mu.Unlock()
		return false
	}
	p.attempts++
	// Not undone by the events stored meanwhile: past its pace a module has some stored in
	// every round, and pauses that started over with each left it sending a thousand refused
	// events every few milliseconds.
	now := time.Now()
	if now.Sub(pl.refusal) > time.Second {
		pl.refused = 0
	}
	pl.refusal = now
	// A refusal that names the pace: no pause, the pace (the node's, or this pipeline's
	// share of it) is what to keep to. Pauses doubling while another sender of the module
	// kept being refused, and the share measured over a paused second (nothing stored: one
	// a second), left two instances crawling: 114–160 of their 2,000 events unanswered
	// after a minute (TestAdmit_PacedNotBarred, 2 runs of 3 here, before this change too).
	named := false
	if refused && refusal.code == api.AdmitOverRate {
		// An attempt sent at the pace the node named and refused all the same: another
		// sender of the module shares the node's pace (a second instance, a second client),
		// and the rate the node stored this pipeline's events at is its share (slowTo, as with
		// an admitter that names no pace). Each keeping to the whole would be refused without
		// end, and barred for flooding.
		shared := pl.pace != nil && (!pl.told || p.last.After(pl.paceAt))
		var perSecond float64
		perSecond, named = api.OverRatePace(refusal.description)
		if named && !shared {
			pl.keepTo(now, perSecond)
		} else {
			pl.slowTo(now, perSecond*paceMargin/shareFloor) // perSecond 0 when none is named
		}
	}
	if !named && now.After(pl.resume) { // the first refusal of this pause: it doubles the last
		pl.refused++
		pl.resume = now.Add(backOffDelay(pl.refused))
	}
	// Sent again in the order refused, spread over a tenth of the pause: not all at once; and
	// at the pace, once there is one.
	pause := max(pl.resume.Sub(now), 0) // none after a refusal that named the pace
	delay := pause + time.Duration(rand.Int64N(int64(pause/10)+1))
	if pl.pace != nil {
		delay = max(delay, pl.pace.ReserveN(now, 1).DelayFrom(now))
	}
	p.last = now.Add(delay)
	pl.mu.Unlock()
	time.AfterFunc(delay, func() {
		if _, err := pl.js.PublishMsgAsync(m, noRetry); err != nil {
			c.answered(m, fmt.Errorf("publish %s (event %s): %w", m.Subject, p.id, err))
		}
	})
	return true
}

// keepTo sets the pipeline's pace to a little under the node's (paceMargin), perSecond, as
// its refusal named it. pl.mu is held.
func (pl *pipeline) keepTo(now time.Time, perSecond float64) {
	l := rate.Limit(perSecond * paceMargin)
	if pl.pace != nil && pl.told && pl.pace.Limit() == l {
		return // kept already: a new limiter would hand out its burst again, to every refused event
	}
	burst := paceBurst(l)
	pl.pace, pl.paceAt, pl.told = rate.NewLimiter(l, burst), now, true
	pl.pace.AllowN(now, burst) // empty: the node's own burst was just spent, on this window
}

// paceMargin is how far under a pace the node named a pipeline keeps: sent at the node's own
// rate, timing alone would refuse some.
const paceMargin = 0.95

// shareFloor bounds how far a pipeline sharing a named pace slows: to a tenth of the pace at
// least, so that ten senders of one module together keep under it, and a share measured over
// a second of refusals (little stored) does not ratchet the pace down to a crawl.
const shareFloor = 10

// slowTo sets the pipeline's pace to the rate its events were stored at over the last second
// (at least floor, and one a second), unless it is slower already. pl.mu is held.
func (pl *pipeline) slowTo(now time.Time, floor float64) {
	stored := rate.Limit(max(pl.stored.perSecond(now), floor, 1))
	if pl.pace == nil || stored < pl.pace.Limit() {
		pl.pace, pl.paceAt, pl.told = rate.NewLimiter(stored, paceBurst(stored)), now, false
	}
}

// ackRate counts events in tenths of a second over the last second.
type ackRate struct {
	n  [10]int
	at int64 // the current tenth, in tenths since the epoch
	// since is when the events began to be stored without a second's gap: a pipeline refused
	// in its first second has stored only a node's burst (a quarter of its pace), which is
	// no rate a second.
	since, last time.Time
}

// perSecond is the events stored over the last second, or over the time since they began
// if that is shorter — half a second at least: a node's burst, stored at once, taken for a
// tenth of a second's worth set a pace far past the node's, and its refusals barred the
// module for flooding.
func (r *ackRate) perSecond(now time.Time) float64 {
	over := min(max(now.Sub(r.since), 500*time.Millisecond), time.Second)
	return float64(r.lastSecond(now)) / over.Seconds()
}

func (r *ackRate) advance(now time.Time) {
	i := now.UnixNano() / int64(100*time.Millisecond)
	if i-r.at >= int64(len(r.n)) {
		r.n = [10]int{}
	} else {
		for t := r.at + 1; t <= i; t++ {
			r.n[t%int64(len(r.n))] = 0
		}
	}
	r.at = i
}

func (r *ackRate) add(now time.Time) {
	if now.Sub(r.last) > time.Second {
		r.since = now
	}
	r.last = now
	r.advance(now)
	r.n[r.at%int64(len(r.n))]++
}

func (r *ackRate) lastSecond(now time.Time) int {
	r.advance(now)
	sum := 0
	for _, c := range r.n {
		sum += c
	}
	return sum
}

// paceBurst is what a pipeline at pace l sends at once: a tenth of a second's worth.
func paceBurst(l rate.Limit) int { return max(int(l)/10, 1) }

// toldFor is how long a pace a node named is kept without a refusal before it is dropped.
const toldFor = 10 * time.Second

// paceMost is past any node's pace: a limit grown beyond it is dropped.
const paceMost = 1_000_000

// paused waits until the pipeline's back-off is over and its pace allows one more event, or
// ctx ends.
func (pl *pipeline) paused(ctx context.Context) error {
	pl.mu.Lock()
	now := time.Now()
	wait := pl.resume.Sub(now)
	if pl.pace != nil && pl.told && now.Sub(pl.refusal) > toldFor {
		// The pace a node named, kept for a while without a refusal: the module may be
		// allowed more now (another node, a setting changed). Dropped, a refusal names it again.
		pl.pace = nil
	}
	if pl.pace != nil && !pl.told && now.Sub(pl.refusal) > time.Second && now.Sub(pl.paceAt) > time.Second {
		// A second without a refusal: try twice the pace.
		if l := pl.pace.Limit() * 2; l > paceMost {
			pl.pace = nil
		} else {
			pl.pace.SetLimitAt(now, l)
			pl.pace.SetBurstAt(now, paceBurst(l))
			pl.paceAt = now
		}
	}
	if pl.pace != nil {
		wait = max(wait, pl.pace.ReserveN(now, 1).DelayFrom(now))
	}
	pl.mu.Unlock()
	if wait <= 0 {
		return nil
	}
	return sleep(ctx, wait)
}

// answered settles msg's Pending with err and frees its slot.
func (c *Client) answered(m *nats.Msg, err error) {
	pl := &c.pipeline
	pl.mu.Lock()
	p := pl.inflight[m]
	if p == nil {
		pl.mu.Unlock()
		return
	}
	delete(pl.inflight, m)
	if err != nil {
		pl.failed = append(pl.failed, err)
	} else {
		pl.stored.add(time.Now())
	}
	if len(pl.inflight) == 0 && pl.drained != nil {
		close(pl.drained)
		pl.drained = nil
	}
	pl.mu.Unlock()
	p.err = err
	close(p.done)
	pl.bytes.Release(p.size)
	<-pl.slots
}

// abandonInflight settles every event still in flight as not known to be stored: the
// connection closed before JetStream answered.
func (c *Client) abandonInflight() {
	pl := &c.pipeline
	if !pl.used.Load() {
		return
	}
	pl.mu.Lock()
	msgs := make([]*nats.Msg, 0, len(pl.inflight))
	for m := range pl.inflight {
		msgs = append(msgs, m)
	}
	pl.mu.Unlock()
	for _, m := range msgs {
		c.answered(m, fmt.Errorf("publish %s (event %s): the client closed before JetStream answered; it may have been stored: retry with sdk.Retry(id)",
			m.Subject, m.Header.Get(envelope.EventID)))
	}
}

// failures returns and forgets the failures not yet reported by a Flush.
func (c *Client) failures() error {
	pl := &c.pipeline
	pl.mu.Lock()
	defer pl.mu.Unlock()
	failed := pl.failed
	pl.failed = nil
	return errors.Join(failed...)
}

// asyncEmitError says why an event EmitAsync sent was not stored, as publishAs does for
// Emit, but without asking the bus anything: nats.go calls it holding its publisher's lock
// when the answer timed out.
func (c *Client) asyncEmitError(m *nats.Msg, err error) error {
	id := m.Header.Get(envelope.EventID)
	if refusal, ok := admitRefusal(err); ok {
		if refusal.code == api.AdmitOverQuota {
			return fmt.Errorf("publish %s (event %s): %w: %s", m.Subject, id, ErrOverQuota, refusal.description)
		}
		if api.AdmitRetryable(refusal.code) {
			return fmt.Errorf("publish %s (event %s): %w: %s; retry with sdk.Retry(id)", m.Subject, id, ErrBackPressure, refusal.description)
		}
		return fmt.Errorf("publish %s (event %s): refused by the node's admitter: %s", m.Subject, id, refusal.description)
	}
	if r := c.refusal(m.Subject); r != nil {
		return fmt.Errorf("publish %s (event %s): %w; is the module registered with the manifest that declares it, and within its EVENTS quota (a synchronous Emit says)?", m.Subject, id, r)
	}
	if jsretry.Leaderless(err) {
		return fmt.Errorf("publish %s (event %s): %w: nothing answered it for %s, neither the node's admitter nor a stream; is the node up (`meshnode status`)?", m.Subject, id, ErrNoQueue, admitterAwayFor)
	}
	return fmt.Errorf("publish %s (event %s; it may have been stored: retry with sdk.Retry(id)): %w", m.Subject, id, err)
}
