package sdk

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// EmitOption sets an optional envelope header.
type EmitOption func(*envelope.Options)

// CausedBy sets x-causation-id: the event that caused this one.
func CausedBy(eventID string) EmitOption { return func(o *envelope.Options) { o.Causation = eventID } }

// WithSchema sets x-schema: the payload's schema.
func WithSchema(schema string) EmitOption { return func(o *envelope.Options) { o.Schema = schema } }

// WithTraceparent sets the W3C traceparent the event carries (an invalid one is left out).
// Inside a handler there is no need: what it emits with the handler's context carries a
// child of the handled event's traceparent, and x-causation-id, on its own.
func WithTraceparent(tp string) EmitOption { return func(o *envelope.Options) { o.Traceparent = tp } }

// handling is the context key of the event a handler is running for.
type handling struct{}

// withHandled returns ctx carrying e, the event a handler runs for.
func withHandled(ctx context.Context, e Event) context.Context {
	return context.WithValue(ctx, handling{}, e)
}

// causedBy fills what an event emitted while handling another inherits from it, unless the
// caller set it: x-causation-id, and a child of its traceparent.
func causedBy(ctx context.Context, o *envelope.Options) {
	cause, ok := ctx.Value(handling{}).(Event)
	if !ok {
		return
	}
	if o.Causation == "" {
		o.Causation = cause.ID
	}
	if o.Traceparent == "" {
		o.Traceparent = envelope.ChildTraceparent(cause.Header.Get(envelope.Traceparent))
	}
}

// Retry makes this Emit or Submit a retry of an earlier one that returned id with an error:
// the event keeps its id and its time, so if the earlier attempt was stored after all (a
// timeout is not a refusal) the broker drops the copy within its 2-minute duplicate window,
// and consumers and the audit log see one event outside it. An id older than
// envelope.MaxResendAge (5 minutes) is refused: consumers would take its x-time for a replay.
func Retry(id string) EmitOption { return func(o *envelope.Options) { o.ID = id } }

// Emit publishes one of the module's declared events, persistently, and returns its
// x-event-id once JetStream has stored it. payload is JSON-encoded unless it is []byte,
// json.RawMessage or a string. The id is fixed before the first attempt and returned with
// any error after it: an Emit that timed out may still have been stored, and passing the id
// back with Retry(id) makes trying again safe. Within the call, a send whose ack does not come
// in 5 s (a stream electing its leader, a lost ack) is sent again, the same event, waiting
// twice as long each time up to 20 s, within ctx (10 s if it has no deadline) and for at most
// a minute after the first send: the stream's duplicate window (2 minutes, or EVENTS'
// events-max-age if shorter) stores it once.
func (c *Client) Emit(ctx context.Context, event string, payload any, opts ...EmitOption) (string, error) {
	subject, err := c.emitSubject(event)
	if err != nil {
		return "", err
	}
	return c.publish(ctx, subject, payload, opts)
}

// emitSubject is the subject of one of the module's declared events, or ErrNotDeclared
// saying what to declare.
func (c *Client) emitSubject(event string) (string, error) {
	self := c.declared()
	if !slices.Contains(self.Emits, event) {
		if local, ok := strings.CutPrefix(event, self.Module+"."); ok && slices.Contains(self.Emits, local) {
			return "", fmt.Errorf("%w: module %s emits %q, named without the module (consumers write %s.%s): write %q",
				ErrNotDeclared, self.Module, local, self.Module, local, local)
		}
		return "", fmt.Errorf("%w: module %s does not emit %q (it emits %v); add it to emits: in its manifest and re-register",
			ErrNotDeclared, self.Module, event, self.Emits)
	}
	return manifest.EventSubject(self.Module, event), nil
}

// Submit sends a job to a seat the module uses: it waits in the seat's work queue until the
// holder takes it. A node-scoped seat's job goes to the holder on the module's own node.
func (c *Client) Submit(ctx context.Context, seat, verb string, payload any, opts ...EmitOption) (string, error) {
	info, err := c.usedSeat(ctx, seat)
	if err != nil {
		return "", err
	}
	if info.Scope == "" {
		return "", fmt.Errorf("%w: seat %s has no work queue until a module declaring it is registered; register that module (meshnode module register, with seats: {%s: {scope: ..., retain: ..., accepts: [%s]}}), then submit again",
			ErrUndeclaredSeat, seat, seat, verb)
	}
	if err := accepts(info, verb); err != nil {
		return "", err
	}
	if shape := info.Shapes[verb]; c.shapes && shape != nil {
		body, err := encode(payload)
		if err != nil {
			return "", err
		}
		if err := checkShape(shape, "seat "+seat+" accept "+verb, body); err != nil {
			return "", err
		}
	}
	// The version the module is pinned to (whoami says; `meshnode seat pin` moves it).
	subject := manifest.SeatAcceptSubjectAt(seat, info.Version, verb)
	if info.Scope == manifest.ScopeNode {
		subject = manifest.SeatNodeAcceptSubjectAt(seat, info.Version, c.node(), verb)
	}
	return c.publish(ctx, subject, payload, opts)
}

// usedSeat returns what the bus knows of a seat the module uses, asking again if the seat's
// declarer was not registered when the client connected.
func (c *Client) usedSeat(ctx context.Context, seat string) (api.SeatInfo, error) {
	c.mu.Lock()
	self := c.self
	c.mu.Unlock()
	i := slices.IndexFunc(self.Uses, func(s api.SeatInfo) bool { return s.Seat == seat })
	if i < 0 {
		return api.SeatInfo{}, fmt.Errorf("%w: module %s does not use seat %q; add it to uses: in its manifest and re-register",
			ErrNotDeclared, self.Module, seat)
	}
	if self.Uses[i].Scope != "" {
		return self.Uses[i], nil
	}
	fresh, err := askWhoami(ctx, c.nc, c.pub, false)
	if err != nil {
		return self.Uses[i], nil // keep what we knew; the publish will say what is wrong
	}
	c.mu.Lock()
	c.self = fresh
	c.mu.Unlock()
	for _, s := range fresh.Uses {
		if s.Seat == seat {
			return s, nil
		}
	}
	return self.Uses[i], nil
}

// EmitSeat publishes one of a seat's declared events as the seat: x-source is the seat's
// name (what its consumers, `consumes: [seat.<seat>.<event>]`, see), signed by this
// instance's key, the declaring module's. Only the seat's holder may emit: the bus refuses
// anyone else's publish, and EmitSeat refuses at once with ErrNotHolder on an instance that
// does not hold the seat.
func (c *Client) EmitSeat(ctx context.Context, seat, event string, payload any, opts ...EmitOption) (string, error) {
	return c.EmitSeatAt(ctx, seat, manifest.V1, event, payload, opts...)
}

// EmitSeatAt is EmitSeat in a version of the seat's protocol ("" or v1: the first): the
// consumers pinned to that version hear it. A holder serving several versions emits an
// event once in each version whose consumers should hear it, in that version's shape.
func (c *Client) EmitSeatAt(ctx context.Context, seat, version, event string, payload any, opts ...EmitOption) (string, error) {
	self := c.declared()
	i := slices.IndexFunc(self.Seats, func(s api.SeatInfo) bool { return s.Seat == seat })
	if i < 0 {
		return "", fmt.Errorf("%w: module %s declares no seat %q", ErrNotDeclared, self.Module, seat)
	}
	info, ok := self.Seats[i].At(version)
	if !ok {
		return "", fmt.Errorf("%w: seat %s has no protocol version %q (it has %v)", ErrNotDeclared, seat, version, versionNames(self.Seats[i]))
	}
	if !slices.Contains(info.Emits, event) {
		return "", fmt.Errorf("%w: seat %s emits %v in %s, not %q; add it to the seat's emits: and re-register",
			ErrNotDeclared, seat, info.Emits, manifest.NormalVersion(version), event)
	}
	if holding, _ := c.Holding(seat); !holding {
		return "", fmt.Errorf("%w: this instance does not hold seat %s, so it may not emit its events", ErrNotHolder, seat)
	}
	return c.publishAs(ctx, seat, manifest.SeatEventSubjectAt(seat, version, event), payload, opts)
}

// publish stamps an envelope with the module as x-source and publishes it to JetStream.
func (c *Client) publish(ctx context.Context, subject string, payload any, opts []EmitOption) (string, error) {
	return c.publishAs(ctx, c.Module(), subject, payload, opts)
}

// stamp encodes payload and stamps its envelope: source as x-source, signed by the client.
func (c *Client) stamp(ctx context.Context, source, subject string, payload any, opts []EmitOption) (nats.Header, []byte, error) {
	body, err := encode(payload)
	if err != nil {
		return nil, nil, err
	}
	var o envelope.Options
	for _, opt := range opts {
		opt(&o)
	}
	causedBy(ctx, &o)
	if o.ID == "" && c.clock != nil {
		id, err := envelope.NewIDAt(c.clock())
		if err != nil {
			return nil, nil, err
		}
		o.ID = id.String()
	}
	if o.ID != "" {
		now := time.Now
		if c.clock != nil {
			now = c.clock
		}
		if id, err := envelope.ParseID(o.ID); err == nil && now().Sub(envelope.IDTime(id)) > envelope.MaxResendAge {
			return nil, nil, fmt.Errorf("Retry(%s): the event is older than %s, and consumers would refuse its x-time as a replay; emit it as a new event, with sdk.CausedBy(%q) if it helps to name the first",
				o.ID, envelope.MaxResendAge, o.ID)
		}
	}
	h, err := envelope.Stamp(c.key, source, c.node(), subject, body, o)
	return h, body, err
}

// publishAs stamps an envelope with source as x-source and publishes it to JetStream through
// the node's admitter, turning the bus's silences into errors that say why. A refusal the
// admitter calls retryable (the audit log behind, the module past its pace) is sent again
// after a back-off, within ctx.
func (c *Client) publishAs(ctx context.Context, source, subject string, payload any, opts []EmitOption) (string, error) {
	h, body, err := c.stamp(ctx, source, subject, payload, opts)
	if err != nil {
		return "", err
	}
	id := h.Get(envelope.EventID)
	// The wait for the ack ends when the connection drops: the bus drops a module's
	// connections when its authority changes, and what it may publish is asked again on the
	// retry, not carried over in nats.go's reconnect buffer.
	admit := manifest.AdmitSubject(c.Module(), subject)
	ctx, deadline, dropped, end := c.waitContext(ctx, admit)
	defer end()
	// A duplicate ack is success: an earlier attempt of this very event was stored.
	first, wait := time.Now(), c.ackWait()
	// away is when a send first met no responder since the last answer or lost ack
	// (admitterAwayFor); lostOnce, that a send went unanswered, so it may have been stored.
	var away time.Time
	lostOnce := false
	for attempt, absent := 0, 0; ; {
		// An ack lost on the way (a stream leader's change, a connection the server dropped
		// while the module's stayed up) never comes: each send waits at most wait, and the
		// same event goes again while the stream's duplicate window surely spans both.
		sendBy := deadline
		if now := time.Now(); now.Sub(first) < resendWithin && now.Add(wait).Before(deadline) {
			sendBy = now.Add(wait)
		}
		actx, acancel := context.WithDeadline(ctx, sendBy)
		_, err := c.js.PublishMsg(actx, &nats.Msg{Subject: admit, Header: h, Data: body}, noRetry)
		lost := unanswered(err, actx, ctx) && sendBy.Before(deadline)
		acancel()
		if err == nil {
			return id, nil
		}
		if jsretry.Leaderless(err) { // no responder: stored nowhere
			if away.IsZero() {
				away = time.Now()
			}
			var werr error
			if time.Since(away) < admitterAwayFor {
				if werr = backOffUntil(ctx, deadline, absent); werr == nil {
					absent++
					continue
				}
			}
			if r := Refused(ctx); r != nil {
				return id, fmt.Errorf("publish %s: %w; is the module registered with the manifest that declares it?", subject, r)
			}
			maybe := ""
			if lostOnce {
				maybe = " (an earlier send went unanswered and may have been stored: retry with sdk.Retry(id))"
			}
			err = fmt.Errorf("%w: nothing answered %s for %s, neither the node's admitter nor a stream%s; is the node up (`meshnode status`)?", ErrNoQueue, subject, time.Since(away).Round(time.Millisecond), maybe)
			if werr != nil && ctx.Err() != nil {
				err = fmt.Errorf("%w: %w", err, werr) // the caller's context ended, or the connection dropped
			}
			return id, err
		}
		away, absent = time.Time{}, 0 // an answer, or a lost ack: the admitter was there
		if lost {
			c.log.Debug("no ack in time; sending the event again", "subject", subject, "id", id, "waited", wait)
			wait = min(2*wait, ackWaitMost)
			lostOnce = true
			continue
		}
		if jsretry.InProcess(err) { // an earlier send is still being stored: the next is its duplicate
			if werr := backOffUntil(ctx, deadline, attempt); werr == nil {
				attempt++
				continue
			}
		}
		if refusal, ok := admitRefusal(err); ok {
			if api.AdmitRetryable(refusal.code) {
				if werr := backOffUntil(ctx, deadline, attempt); werr == nil {
					attempt++
					continue
				}
				return id, fmt.Errorf("publish %s (event %s): %w: %s; retry with sdk.Retry(id)", subject, id, ErrBackPressure, refusal.description)
			}
			if refusal.code == api.AdmitOverQuota {
				return id, fmt.Errorf("publish %s: %w: %s", subject, ErrOverQuota, refusal.description)
			}
			return id, fmt.Errorf("publish %s: refused by the node's admitter: %s", subject, refusal.description)
		}
		if r := Refused(ctx); r != nil {
			return id, fmt.Errorf("publish %s: %w; is the module registered with the manifest that declares it?", subject, r)
		}
		if dropped() {
			return id, fmt.Errorf("publish %s (event %s): the connection dropped before the ack, so it may have been stored; retry with sdk.Retry(id): %w", subject, id, errDropped)
		}
		return id, fmt.Errorf("publish %s (event %s; it may have been stored: retry with sdk.Retry(id)): %w", subject, id, err)
	}
}

// unanswered reports whether a request sent under attempt, a context of caller's with a
// shorter deadline, failed only because attempt's deadline passed with no answer: the
// request or its answer may have been lost, and the caller still waits.
func unanswered(err error, attempt, caller context.Context) bool {
	return (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) &&
		attempt.Err() != nil && caller.Err() == nil
}

// How long one send of an event waits for the stream's ack before the event is sent again
// (Emit, Submit): ackWaitFirst, doubling to ackWaitMost. A send is repeated only within
// resendWithin of the first, well inside the streams' duplicate window (2 minutes, EVENTS'
// shorter only if events-max-age is), so the stream stores the event once; after that the
// last send waits for the caller's context.
const (
	ackWaitFirst = 5 * time.Second
	ackWaitMost  = 20 * time.Second
	resendWithin = time.Minute
)

// An event or job sent while its node's admitter is away has no responder: the server cut the
// admitter off for falling behind a burst (it holds 64 MiB for a connection at most), and it
// is connecting again, 10 ms after, then longer, up to a second or so on a loaded machine. The
// sdk sends it again after a back-off (backOffDelay, from 2 ms to 250 ms: 4–8 times a second
// once long, about 30 times in all) for admitterAwayFor from the first no responder, then
// reports ErrNoQueue. nats.go's own retry (2 tries 250 ms apart) let an emit fail in a local CI
// run while the admitter took 1.5 s to come back, and cannot back off: it is turned off
// (noRetry).
const admitterAwayFor = 5 * time.Second

// noRetry turns off nats.go's own retry of a publish that meets no responder (admitterAwayFor).
var noRetry = jetstream.WithRetryAttempts(0)

// ackWait is the first send's wait for its ack (ackWaitFirst; tests shorten it).
func (c *Client) ackWait() time.Duration {
	if c.firstAckWait > 0 {
		return c.firstAckWait
	}
	return ackWaitFirst
}

// admission is an admitter's refusal, as nats.go returns it.
type admission struct {
	code        int
	description string
}

// admitRefusal reads err as the admitter's refusal (api.Admit* codes); ok is false for any
// other error.
func admitRefusal(err error) (admission, bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return admission{}, false
	}
	code := int(apiErr.ErrorCode)
	if code < api.AdmitOverQuota || code > api.AdmitCutOff {
		return admission{}, false
	}
	return admission{code: code, description: apiErr.Description}, true
}

// The back-off after a retryable refusal: doubling from backOffFirst to backOffMost, with
// jitter, so emitters refused together do not come back together.
const (
	backOffFirst = 2 * time.Millisecond
	backOffMost  = 250 * time.Millisecond
)

// backOffDelay is how long attempt waits.
func backOffDelay(attempt int) time.Duration {
	d := backOffFirst << min(attempt, 10)
	d = min(d, backOffMost)
	return d/2 + rand.N(d/2+1)
}

// backOffUntil waits before attempt's retry (backOffDelay), or returns ctx's error; a retry
// that could not be sent before deadline is not waited for.
func backOffUntil(ctx context.Context, deadline time.Time, attempt int) error {
	d := backOffDelay(attempt)
	if time.Until(deadline) < d {
		return context.DeadlineExceeded
	}
	return sleep(ctx, d)
}

// sleep waits d, or returns ctx's error if it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
