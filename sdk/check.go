package sdk

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What the sdk checks before a handler sees an event (issue 12): the bus lets only a module
// publish on its own subjects, but a stream can hold what another writer put there (the
// operator's connection, a node), so the envelope itself must prove its source:
//   - the required headers are there, and x-event-id is a UUIDv7;
//   - x-source owns the subject: a module its own events, the declaring module or the seat
//     itself a seat's, a server the servers' events; a job's x-source is a module whose key
//     whoami gave for the seat's holder (its users and its module);
//   - x-signature verifies with the source's registered key (whoami's Signers, asked again
//     when a key is missing or does not verify, since modules register and rotate keys);
//   - x-time is within the replay window of when the stream stored the event, so an old
//     signed event published again is refused; a module that was away for days still gets
//     its backlog, whose store times are old too. A `meshnode dead replay` is exempt: it is
//     the operator's deliberate re-delivery of an old event.
// An event that fails is never handed to a handler: it is terminated with the reason, and
// the node dead-letters it. Header names are matched exactly, as NATS matches them on the
// wire (case-sensitive): x-source, not X-Source.

// DefaultReplayWindow is how far an event's x-time may be from when its stream stored it.
const DefaultReplayWindow = 10 * time.Minute

// WithReplayWindow sets how far a delivered event's x-time may be from the time its stream
// stored it (DefaultReplayWindow); 0 turns the check off.
func WithReplayWindow(d time.Duration) Option { return func(o *options) { o.window = d } }

// ErrRejected marks a delivered event that failed the sdk's checks.
var ErrRejected = errors.New("refused by the sdk's checks")

// signerRefresh is the least time between two whoami questions asked for missing keys: a
// stream of forged events costs one question a second, not one each.
const signerRefresh = time.Second

// clockSlack is how far apart a stream's clock and this client's may be when it judges
// whether keys it learnt were already known when an event was stored.
const clockSlack = 2 * time.Second

// errTryLater marks a check that could not be made now (the controller did not answer):
// the event is redelivered later, not given up.
var errTryLater = errors.New("cannot check the event now")

// check returns nil when e, delivered on subject (its original subject) and stored at
// stored, may be handed to a handler; pre is its signature's verdict from its batch, if any.
func (c *Client) check(ctx context.Context, e envelope.Event, stored time.Time, replay bool, pre verdict) error {
	for _, name := range []string{envelope.Node, envelope.ContentType, envelope.Signature} {
		if e.Header.Get(name) == "" {
			return fmt.Errorf("%w: %w %s", ErrRejected, envelope.ErrMissingHeader, name)
		}
	}
	if _, err := envelope.ParseID(e.ID); err != nil {
		return fmt.Errorf("%w: %w", ErrRejected, err)
	}
	kind, owner, _, ok := manifest.SplitSubject(e.Subject)
	if !ok {
		return fmt.Errorf("%w: %s is not an event's subject", ErrRejected, e.Subject)
	}
	job := isJob(e.Subject, kind)
	verify := func(signers api.Signers) (retry bool, err error) {
		key, retry, err := signerOf(e, kind, owner, job, signers)
		if err != nil {
			return retry, err
		}
		if pre.key == key && pre.ok {
			return false, nil // verified with this key in its batch
		}
		if err := c.verifyWith(e, key); err != nil {
			return true, fmt.Errorf("x-signature is not %s's: %w", e.Source, err)
		}
		return false, nil
	}
	retry, err := verify(c.signers())
	if err != nil && retry {
		// Keys change: a module registered or rotated its key since this client asked.
		signers, ferr := c.refreshSigners(ctx, stored)
		if ferr != nil {
			return fmt.Errorf("%w: %w", errTryLater, ferr)
		}
		_, err = verify(signers)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRejected, err)
	}
	// A job is exempt: only the seat's users may submit one, and an old one submitted again
	// is theirs to send (`dead replay` of a job does just that).
	if c.window > 0 && !replay && !job {
		if d := stored.Sub(e.Time); d > c.window || d < -c.window {
			return fmt.Errorf("%w: x-time %s is %s from when the stream stored the event (%s), outside the replay window of %s",
				ErrRejected, e.Header.Get(envelope.Time), d.Round(time.Second), stored.UTC().Format(time.RFC3339), c.window)
		}
	}
	return nil
}

// isJob reports whether subject, of kind, is a seat's job (any version of its protocol).
func isJob(subject string, kind string) bool {
	ss, _ := manifest.ParseSeatSubject(subject)
	return kind == api.SignerSeat && ss.Kind != "event"
}

// signerOf returns the key e's signature must verify with, of signers: e's subject is of
// kind and owner, and job says whether it is a seat's job. retry says whether keys learnt
// since may change the answer.
func signerOf(e envelope.Event, kind string, owner string, job bool, signers api.Signers) (key string, retry bool, err error) {
	switch kind {
	case api.SignerModule:
		if e.Source != owner {
			return "", false, fmt.Errorf("x-source %q does not own %s: it is module %s's event", e.Source, e.Subject, owner)
		}
		key = signers[api.SignerKey(api.SignerModule, owner)]
	case api.SignerNode:
		key = signers[api.SignerKey(api.SignerNode, e.Source)] // a server speaks for any node
		if key == "" {
			return "", true, fmt.Errorf("x-source %q is not a server of the mesh, which alone speaks on %s", e.Source, e.Subject)
		}
	case api.SignerSeat:
		if job {
			// A job: the bus lets only the seat's users (and its module) submit it; the
			// signature says which.
			key = signers[api.SignerKey(api.SignerJob, e.Source)]
			break
		}
		key = signers[api.SignerKey(api.SignerSeat, owner)]
		if e.Source != owner && (key == "" || signers[api.SignerKey(api.SignerModule, e.Source)] != key) {
			return "", key == "", fmt.Errorf("x-source %q does not own %s: it is neither seat %s nor the module that declares it", e.Source, e.Subject, owner)
		}
	default:
		return "", false, fmt.Errorf("%s is not an event's subject", e.Subject)
	}
	if key == "" {
		return "", true, fmt.Errorf("no registered key for x-source %q", e.Source)
	}
	return key, false, nil
}

// verdict is a signature verified ahead of its check, in a batch with the events delivered
// with it: the key it was verified with, and whether it verified.
type verdict struct {
	key string
	ok  bool
}

// verifyAhead verifies the signatures of a run of deliveries together (envelope.VerifyBatch:
// per signature, about two thirds of the cost of one alone at 8, half at 32), with the keys
// whoami last gave. An event whose key is not known yet, or whose envelope is malformed, gets
// no verdict: its check finds out why, one at a time.
func (c *Client) verifyAhead(msgs []jetstream.Msg) []verdict {
	out := make([]verdict, len(msgs))
	if len(msgs) < 2 {
		return out // one alone is verified by its check
	}
	signers := c.signers()
	var (
		signed []envelope.Signed
		at     []int // signed's deliveries
	)
	for i, m := range msgs {
		e, err := envelope.Read(manifest.Original(m.Subject()), m.Headers(), m.Data())
		if err != nil || e.Header.Get(envelope.Signature) == "" {
			continue
		}
		kind, owner, _, ok := manifest.SplitSubject(e.Subject)
		if !ok {
			continue
		}
		key, _, err := signerOf(e, kind, owner, isJob(e.Subject, kind), signers)
		if err != nil {
			continue
		}
		signed = append(signed, envelope.Signed{Header: e.Header, Subject: e.Subject, Body: e.Data, PublicKey: key})
		at = append(at, i)
	}
	for j, err := range envelope.VerifyBatch(signed) {
		out[at[j]] = verdict{key: signed[j].PublicKey, ok: err == nil}
	}
	return out
}

// signers returns the keys whoami last gave.
func (c *Client) signers() api.Signers {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.self.Signers
}

// refreshSigners returns keys learnt after stored, when the event was stored: from an answer
// to a question asked since, or asked now. A key missing from those is not registered; one
// missing from older keys may be new. One question is asked at a time (concurrent checks wait
// for its answer), at most once per signerRefresh; only an answer counts, never a question
// that failed.
func (c *Client) refreshSigners(ctx context.Context, stored time.Time) (api.Signers, error) {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	c.mu.Lock()
	known, signers, tried := c.signersKnown, c.self.Signers, c.signersTried
	c.mu.Unlock()
	// stored is the stream leader's clock, known this client's: a margin for their skew.
	if known.After(stored.Add(clockSlack)) {
		return signers, nil
	}
	if wait := signerRefresh - time.Since(tried); wait > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	asked := time.Now()
	c.mu.Lock()
	c.signersTried = asked
	c.mu.Unlock()
	self, err := askWhoami(ctx, c.nc, c.pub, false)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.self, c.signersKnown = self, asked
	c.mu.Unlock()
	return self.Signers, nil
}

// checkRetry are the waits before each new try of a check that could not be made (the
// controller did not answer): the delivery is kept in progress meanwhile, so a short outage
// costs no delivery attempt; after the last, the event is NAKed.
var checkRetry = []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 10 * time.Second, 20 * time.Second}

// verifyWith checks e's signature with the public key pub.
func (c *Client) verifyWith(e envelope.Event, pub string) error {
	return envelope.Verify(nats.Header(e.Header), e.Subject, e.Data, pub)
}
