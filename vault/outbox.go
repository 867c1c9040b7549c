package vault

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/outbox"
	"github.com/nats-io/nats.go"
)

// The vault's outbox (package outbox): a secret's minted or rotated event is stored in its
// record with the action, and published after it; whichever node serves the vault next
// publishes what a record still holds (at Start, then every outbox.Interval).

// addOutbox adds the event of an action on r to its outbox, to be stored with the action.
func (v *Vault) addOutbox(r *secretRecord, action string, meta map[string]any) error {
	if len(r.Outbox) >= outbox.Max {
		return fmt.Errorf("secret %s of %s has %d actions whose events are not recorded yet; no action is stored without its event, so none is taken until they are: is EVENTS full or without a leader (`meshnode status`)?",
			r.Name, r.Owner, len(r.Outbox))
	}
	meta["node"] = v.cfg.Node
	e, err := outbox.New(action, "", meta)
	if err != nil {
		return err
	}
	r.Outbox = append(r.Outbox, e)
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
	r.Outbox = append([]outbox.Event(nil), r.Outbox...)
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

// sweepOutboxes publishes what every record holds, until ctx ends (outbox.Sweep).
func (v *Vault) sweepOutboxes(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	outbox.Sweep(ctx, v.sweepNow, func(ctx context.Context) (failed bool) {
		v.mu.RLock()
		var keys []string
		for key, e := range v.records {
			if len(e.rec.Outbox) > 0 {
				keys = append(keys, key)
			}
		}
		v.mu.RUnlock()
		for _, key := range keys {
			fctx, cancel := context.WithTimeout(ctx, requestTimeout)
			if err := v.flushOutbox(fctx, key); err != nil {
				v.log.Warn("vault events still waiting in their record; trying again", "key", key, "err", err)
				failed = true
			}
			cancel()
		}
		return failed
	})
}
