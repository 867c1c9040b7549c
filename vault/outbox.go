package vault

import (
	"context"
	"fmt"
	"slices"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/outbox"
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

// flushOutbox publishes the events waiting in the record at key (outbox.Flush): the record
// is written under writeMu, the publishes made without it, so a slow EVENTS never holds up
// the vault's requests.
func (v *Vault) flushOutbox(ctx context.Context, key string) error {
	edit := func(ctx context.Context, f func([]outbox.Event) ([]outbox.Event, bool, error)) ([]outbox.Event, error) {
		return v.editOutbox(ctx, key, f)
	}
	if err := outbox.Flush(ctx, "", edit, v.publishEvent); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

// editOutbox stores the outbox edit returns for the record at key when edit says it changed
// it, under writeMu, and returns the outbox the record then holds.
func (v *Vault) editOutbox(ctx context.Context, key string, edit func([]outbox.Event) ([]outbox.Event, bool, error)) ([]outbox.Event, error) {
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	v.mu.RLock()
	e, ok := v.records[key]
	v.mu.RUnlock()
	if !ok || len(e.rec.Outbox) == 0 {
		return nil, nil
	}
	events, changed, err := edit(slices.Clone(e.rec.Outbox))
	if err != nil || !changed {
		return e.rec.Outbox, err
	}
	r := e.rec
	r.Versions = slices.Clone(r.Versions)
	r.Outbox = events
	if err := v.store(ctx, &r, e.rev); err != nil {
		return nil, err
	}
	return events, nil
}

// publishEvent publishes one waiting vault event, waiting for EVENTS' acknowledgement.
func (v *Vault) publishEvent(ctx context.Context, ev outbox.Event) error {
	return outbox.Publish(ctx, v.js, v.sign, manifest.VaultSeat, v.cfg.Node, api.VaultEventSubject(ev.Action), ev)
}

// sweepOutboxes publishes what every record holds, until ctx ends (outbox.Sweep).
func (v *Vault) sweepOutboxes(ctx context.Context) {
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
			if ctx.Err() != nil {
				return false
			}
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
