package vault

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
)

// The outbox (issue 12): a secret's action and its audit event are one write. The event —
// its id fixed, its body complete — is stored in the secret's record with the action, and
// published afterwards; only once EVENTS has acknowledged it is it removed from the record.
// A vault killed between the two leaves the event in the record, and whichever node serves
// the vault next publishes it (at Start, then every outboxSweep). Published again, it is the
// same event (same id, time, body and signature: envelope.Stamp with Options.ID), so the
// broker drops the copy within its window and the audit log records it once outside it.

// outboxEvent is an event waiting in a record to be published.
type outboxEvent struct {
	ID     string          `json:"id"`
	Action string          `json:"action"`
	Body   json.RawMessage `json:"body"`
}

// maxOutbox bounds the events one record keeps waiting: past it, the vault refuses actions
// on that secret rather than store them without their events.
const maxOutbox = 64

// outboxSweep is how often the vault's server publishes what records still hold.
const outboxSweep = 30 * time.Second

// addOutbox adds the event of an action on r to its outbox, to be stored with the action.
func (v *Vault) addOutbox(r *secretRecord, action string, meta map[string]any) error {
	if len(r.Outbox) >= maxOutbox {
		return fmt.Errorf("secret %s of %s has %d actions whose events are not recorded yet; no action is stored without its event, so none is taken until they are: is EVENTS full or without a leader (`meshnode status`)?",
			r.Name, r.Owner, len(r.Outbox))
	}
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	meta["node"] = v.cfg.Node
	body, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	r.Outbox = append(r.Outbox, outboxEvent{ID: id.String(), Action: action, Body: body})
	return nil
}

// checkOutbox checks a record's outbox read from the bucket: untrusted input.
func checkOutbox(events []outboxEvent) error {
	if len(events) > maxOutbox {
		return fmt.Errorf("the record holds %d waiting events, more than %d", len(events), maxOutbox)
	}
	for _, e := range events {
		if _, err := envelope.ParseID(e.ID); err != nil {
			return fmt.Errorf("a waiting event: %w", err)
		}
		if !manifest.ValidName(e.Action) {
			return fmt.Errorf("a waiting event's action %q is not a name", e.Action)
		}
		var body map[string]any
		if json.Unmarshal(e.Body, &body) != nil {
			return fmt.Errorf("a waiting event's body is not a JSON object")
		}
	}
	return nil
}

// flushOutbox publishes the events waiting in the record at key, in order, and removes those
// EVENTS acknowledged from the record.
func (v *Vault) flushOutbox(ctx context.Context, key string) error {
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	v.mu.RLock()
	e, ok := v.records[key]
	v.mu.RUnlock()
	if !ok || len(e.rec.Outbox) == 0 {
		return nil
	}
	r := e.rec
	r.Outbox = append([]outboxEvent(nil), r.Outbox...)
	r.Versions = append([]version(nil), r.Versions...)
	sent := 0
	var err error
	for _, ev := range r.Outbox {
		if err = v.publishEvent(ctx, ev.ID, ev.Action, ev.Body); err != nil {
			break
		}
		sent++
	}
	if sent > 0 {
		r.Outbox = r.Outbox[sent:]
		if serr := v.store(ctx, &r, e.rev); serr != nil {
			// Published, and still in the record: published again later, as the same event.
			return errors.Join(err, fmt.Errorf("events of %s recorded, but the record keeps them: %w", key, serr))
		}
	}
	return err
}

// publishEvent publishes one vault event, waiting for EVENTS' acknowledgement.
func (v *Vault) publishEvent(ctx context.Context, id, action string, body []byte) error {
	subject := EventSubject(action)
	h, err := envelope.Stamp(v.sign, Seat, v.cfg.Node, subject, body, envelope.Options{ID: id})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := v.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: body}); err != nil {
		return fmt.Errorf("record vault event %s: %w", action, err)
	}
	return nil
}

// sweepOutboxes publishes what every record holds, until stop is closed: at once (a vault
// killed before its events went out), then every outboxSweep, and sooner after a failure (at
// start EVENTS may not have a leader yet): 500 ms, doubling.
func (v *Vault) sweepOutboxes(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	retry := outboxRetry
	for {
		v.mu.RLock()
		var keys []string
		for key, e := range v.records {
			if len(e.rec.Outbox) > 0 {
				keys = append(keys, key)
			}
		}
		v.mu.RUnlock()
		failed := false
		for _, key := range keys {
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			if err := v.flushOutbox(ctx, key); err != nil {
				v.log.Warn("vault events still waiting in their record; trying again", "key", key, "in", retry, "err", err)
				failed = true
			}
			cancel()
		}
		wait := outboxSweep
		if failed {
			wait, retry = retry, min(2*retry, outboxSweep)
		} else {
			retry = outboxRetry
		}
		select {
		case <-stop:
			return
		case <-v.sweepNow:
		case <-time.After(wait):
		}
	}
}

// sweepSoon has the sweeper run now: a flush after a request failed.
func (v *Vault) sweepSoon() {
	select {
	case v.sweepNow <- struct{}{}:
	default:
	}
}

// outboxRetry is the first wait before a sweep that failed is tried again.
const outboxRetry = 500 * time.Millisecond
