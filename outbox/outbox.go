// Package outbox keeps an action's event with the action (issue 12): the event, its id fixed
// and its body complete, is written into the record the action changes, in the same write,
// and published afterwards; the owner takes it out of the record once EVENTS acknowledged it.
// A node killed between the two leaves the event in the record, and a sweep publishes it
// later. Published again by the same signer, it is the same event (envelope.Stamp with
// Options.ID gives the same time and signature), so the broker drops the copy within its
// window and the audit log records it once outside it. The vault's secrets and the
// registry's modules use it.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Event is an event waiting in a record to be published.
type Event struct {
	ID     string          `json:"id"`
	Action string          `json:"action"`
	Node   string          `json:"node,omitempty"`  // the node that acted, when its signer is the node's
	Cause  string          `json:"cause,omitempty"` // the id this event records again (Renew)
	Body   json.RawMessage `json:"body"`
}

// Max bounds the events one record keeps waiting: past it, the owner refuses actions on the
// record rather than store them without their events.
const Max = 64

// New returns the event of an action, its id fixed now.
func New(action, node string, body map[string]any) (Event, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Event{}, err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return Event{}, err
	}
	return Event{ID: id.String(), Action: action, Node: node, Body: b}, nil
}

// MaxAge is how old an event's id may be when it is published (envelope.MaxResendAge): an
// older one is published as a new event (Renew).
const MaxAge = envelope.MaxResendAge

// Renew returns events with each that its publisher cannot publish as it is replaced by a
// new event recording it again (a new id, Cause naming the first): one older than MaxAge,
// or, when node is not "", one another node made (its signature would be another's). The
// owner stores the renewed events before publishing them, so that a publish that is tried
// again is the same event. changed reports whether any was replaced.
func Renew(events []Event, node string) (renewed []Event, changed bool, err error) {
	renewed = append([]Event(nil), events...)
	for i, e := range renewed {
		id, perr := envelope.ParseID(e.ID)
		if perr == nil && time.Since(envelope.IDTime(id)) <= MaxAge && (node == "" || e.Node == node) {
			continue
		}
		fresh, err := uuid.NewV7()
		if err != nil {
			return nil, false, err
		}
		cause := e.Cause
		if cause == "" {
			cause = e.ID
		}
		if node != "" {
			e.Node = node
		}
		e.ID, e.Cause = fresh.String(), cause
		renewed[i], changed = e, true
	}
	return renewed, changed, nil
}

// Without returns events less those whose ids are in sent.
func Without(events []Event, sent []string) []Event {
	var out []Event
	for _, e := range events {
		if !slices.Contains(sent, e.ID) {
			out = append(out, e)
		}
	}
	return out
}

// Check checks a record's waiting events, read from a bucket: untrusted input. action
// reports whether a name is one of the owner's actions.
func Check(events []Event, action func(string) bool) error {
	if len(events) > Max {
		return fmt.Errorf("the record holds %d waiting events, more than %d", len(events), Max)
	}
	for _, e := range events {
		if _, err := envelope.ParseID(e.ID); err != nil {
			return fmt.Errorf("a waiting event: %w", err)
		}
		if !action(e.Action) {
			return fmt.Errorf("a waiting event's action %.40q is not one of the record's", e.Action)
		}
		if e.Cause != "" {
			if _, err := envelope.ParseID(e.Cause); err != nil {
				return fmt.Errorf("a waiting event's cause: %w", err)
			}
		}
		if e.Node != "" && !manifest.ValidName(e.Node) {
			return fmt.Errorf("a waiting event's node %.40q is not a name", e.Node)
		}
		var body map[string]any
		if json.Unmarshal(e.Body, &body) != nil {
			return fmt.Errorf("a waiting event's body is not a JSON object")
		}
	}
	return nil
}

// Edit stores the waiting events an edit returns into a record, when the edit says it
// changed them, under the owner's lock, and returns the events the record then holds.
type Edit func(ctx context.Context, edit func([]Event) (events []Event, changed bool, err error)) ([]Event, error)

// Flush publishes a record's waiting events in order and takes those EVENTS acknowledged out
// of it: first the record is written with the events its publisher must renew (Renew, node
// as there), then each is published with publish — outside the owner's lock, so a slow
// EVENTS holds up nothing else —, then the published are taken out.
func Flush(ctx context.Context, node string, edit Edit, publish func(context.Context, Event) error) error {
	events, err := edit(ctx, func(events []Event) ([]Event, bool, error) { return Renew(events, node) })
	if err != nil || len(events) == 0 {
		return err
	}
	var sent []string
	for _, e := range events {
		if err = publish(ctx, e); err != nil {
			break
		}
		sent = append(sent, e.ID)
	}
	if len(sent) == 0 {
		return err
	}
	if _, eerr := edit(ctx, func(events []Event) ([]Event, bool, error) {
		left := Without(events, sent)
		return left, len(left) != len(events), nil
	}); eerr != nil {
		// Published, and still in the record: published again later, as the same event.
		return errors.Join(err, fmt.Errorf("events recorded, but the record keeps them: %w", eerr))
	}
	return err
}

// How often a sweep runs: every Interval, and after one that failed, FirstRetry later,
// doubling up to Interval (at start EVENTS may not have a leader yet).
const (
	Interval   = 30 * time.Second
	FirstRetry = 500 * time.Millisecond
)

// Sweep runs sweep at once, then every Interval, sooner after a sweep that reports a failure,
// and whenever wake is signalled, until ctx ends.
func Sweep(ctx context.Context, wake <-chan struct{}, sweep func(ctx context.Context) (failed bool)) {
	retry := FirstRetry
	for {
		wait := Interval
		if sweep(ctx) {
			wait, retry = retry, min(2*retry, Interval)
		} else {
			retry = FirstRetry
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-time.After(wait):
		}
	}
}

// Wake signals wake without waiting: a sweep soon is enough.
func Wake(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// NodeEvent is mesh.node.<node>.event.<name> with meta as its body, stamped and signed by the
// node: node is the publisher itself, whatever the event is about (an event is genuine only
// from its subject's owner). A msgID, if given, replaces the Nats-Msg-Id, so EVENTS keeps one
// of the servers' copies.
func NodeEvent(key envelope.Signer, node, name string, meta map[string]any, msgID ...string) (*nats.Msg, error) {
	body, _ := json.Marshal(meta)
	subject := manifest.NodeEventSubject(node, name)
	h, err := envelope.Stamp(key, node, node, subject, body, envelope.Options{})
	if err != nil {
		return nil, err
	}
	for _, id := range msgID {
		h.Set(nats.MsgIdHdr, id)
	}
	return &nats.Msg{Subject: subject, Header: h, Data: body}, nil
}

// publishTimeout bounds one event's publish, EVENTS' acknowledgement included.
const publishTimeout = 5 * time.Second

// Publish stamps ev as source on node, signed with key, and publishes it on subject, waiting
// for the stream's acknowledgement: the same event each time it is tried (same id, time and
// causation), so a retry after a lost acknowledgement is a duplicate the broker drops.
func Publish(ctx context.Context, js jetstream.JetStream, key envelope.Signer, source, node, subject string, ev Event) error {
	h, err := envelope.Stamp(key, source, node, subject, ev.Body, envelope.Options{ID: ev.ID, Causation: ev.Cause})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: ev.Body}); err != nil {
		return fmt.Errorf("record %s: %w", ev.Action, err)
	}
	return nil
}
