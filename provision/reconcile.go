package provision

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
)

// ErrUnavailable means no provider answered (its seat has no holder yet): the provision
// waits, it has not failed.
var ErrUnavailable = errors.New("provider unavailable")

// Provider is one provisioner as the controller reaches it: a seat's tools over the bus, or
// the mesh itself for kv.
type Provider interface {
	Create(ctx context.Context, req api.ProvisionCreateRequest) (api.ProvisionCreateReply, error)
	Remove(ctx context.Context, req api.ProvisionRemoveRequest) error
	Holds(ctx context.Context, iface string) ([]string, error)
}

// Store keeps the records (the Bucket, or a map in tests).
type Store interface {
	All(ctx context.Context) (map[string]api.Provision, error)
	Put(ctx context.Context, r api.Provision) error
	Delete(ctx context.Context, key string) error
}

// Reconciler brings provisions to what the deployed modules want: it creates what is
// missing, removes what nobody wants, and — on a holds pass — asks each provider what it
// holds, re-creating what it lost and removing orphans. Each change is an event.
type Reconciler struct {
	Store Store
	// Provider returns the provider behind a seat (MeshProvider for the mesh's own).
	Provider func(seat string) Provider
	// IntakeKey returns the vault's intake xkey, which providers seal credentials to.
	IntakeKey func(ctx context.Context) (string, error)
	// Keep hands a provider's sealed credential to the vault, to keep under the consumer;
	// Drop has the vault forget it. Neither is called for the mesh's own interfaces.
	Keep func(ctx context.Context, consumer, iface string, reply api.ProvisionCreateReply) error
	Drop func(ctx context.Context, consumer, iface string) error
	// Event records one change: provisioned, deprovisioned or provision-failed, metadata
	// only.
	Event func(ctx context.Context, action string, meta map[string]any)
	Log   *slog.Logger
	// RetryFailed is how long a failed provision waits before it is tried again.
	RetryFailed time.Duration

	// CallTimeout bounds each call to a provider or the vault (zero: DefaultCallTimeout): a
	// holder that takes a call and never answers must not stop every other provision.
	CallTimeout time.Duration

	mu    sync.Mutex           // one pass at a time (a holder that let go and took the seat again)
	tried map[string]time.Time // when each provision was last created, by key
}

// DefaultCallTimeout bounds a call to a provider or the vault.
const DefaultCallTimeout = 30 * time.Second

// bounded is ctx bounded by the call timeout.
func (r *Reconciler) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	d := r.CallTimeout
	if d == 0 {
		d = DefaultCallTimeout
	}
	return context.WithTimeout(ctx, d)
}

// Result is what one pass changed: the consumers whose provisions changed (their nodes are
// declared again) and whether anything still waits or failed (the next pass comes soon).
type Result struct {
	Changed []string
	Pending bool
}

// Pass reconciles once. With holds it also asks every provider in use what it holds.
func (r *Reconciler) Pass(ctx context.Context, wants []Want, holds bool) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	recs, err := r.Store.All(ctx)
	if err != nil {
		return Result{}, err
	}
	changed := map[string]bool{}
	wanted := map[string]Want{}
	for _, w := range wants {
		wanted[w.Key()] = w
	}
	// What nobody wants any more, or wants from another provider, is removed first.
	for _, key := range slices.Sorted(maps.Keys(recs)) {
		rec := recs[key]
		w, ok := wanted[key]
		if ok && (w.Provider == rec.Provider || rec.Provider == "" || w.Problem != "") {
			continue // a provider that left keeps what it made until one is chosen again
		}
		reason := "its consumer no longer runs"
		if ok {
			reason = "its consumer now uses provider " + w.Provider
		}
		if err := r.deprovision(ctx, rec, reason); err != nil {
			r.log().Warn("deprovision; trying again", "consumer", rec.Consumer, "interface", rec.Interface, "err", err)
			continue
		}
		delete(recs, key)
		changed[rec.Consumer] = true
	}
	pending := false
	for _, w := range wants {
		rec, ok := recs[w.Key()]
		switch {
		case w.Problem != "" && ok && rec.State == StateReady:
			continue
		case w.Problem != "":
			pending = true
			r.put(ctx, rec, ok, api.Provision{Consumer: w.Consumer, Interface: w.Interface, State: StateWaiting, Reason: w.Problem, Generation: rec.Generation})
			continue
		case ok && rec.State == StateReady && maps.Equal(rec.Options, w.Options):
			continue
		case ok && rec.State == StateFailed && maps.Equal(rec.Options, w.Options) && time.Since(r.tried[w.Key()]) < r.RetryFailed:
			pending = true
			continue
		}
		if r.tried == nil {
			r.tried = map[string]time.Time{}
		}
		r.tried[w.Key()] = time.Now()
		why := "created"
		if ok && rec.State == StateReady {
			why = "created again: its options changed"
		}
		next := r.create(ctx, w, rec, why)
		if next.State == StateReady {
			changed[w.Consumer] = true
		} else {
			pending = true
		}
		recs[w.Key()] = next
	}
	if holds {
		r.holds(ctx, wants, recs, changed)
	}
	return Result{Changed: slices.Sorted(maps.Keys(changed)), Pending: pending}, nil
}

// holds asks each provider in use which consumers it holds: a wanted, ready provision it
// lost is created again; a consumer it holds that nobody wants of it is removed.
func (r *Reconciler) holds(ctx context.Context, wants []Want, recs map[string]api.Provision, changed map[string]bool) {
	type pair struct{ provider, iface string }
	byPair := map[pair][]Want{}
	for _, w := range wants {
		if w.Provider != "" {
			p := pair{w.Provider, w.Interface}
			byPair[p] = append(byPair[p], w)
		}
	}
	for p, ws := range byPair {
		cctx, cancel := r.bounded(ctx)
		held, err := r.Provider(p.provider).Holds(cctx, p.iface)
		cancel()
		if err != nil {
			r.log().Warn("ask a provider what it holds; asked again at the next pass", "provider", p.provider, "interface", p.iface, "err", err)
			continue
		}
		for _, w := range ws {
			rec := recs[w.Key()]
			if rec.State != StateReady || slices.Contains(held, w.Consumer) {
				continue
			}
			r.log().Warn("a provider lost a provision: creating it again", "consumer", w.Consumer, "interface", w.Interface, "provider", w.Provider)
			next := r.create(ctx, w, rec, "re-created: the provider no longer held it")
			recs[w.Key()] = next
			changed[w.Consumer] = true
		}
		for _, consumer := range held {
			if slices.ContainsFunc(ws, func(w Want) bool { return w.Consumer == consumer }) {
				continue
			}
			if r, ok := recs[Key(consumer, p.iface)]; ok && r.Provider == p.provider {
				continue // its consumer still has it (waiting for a choice, or moving away)
			}
			cctx, cancel := r.bounded(ctx)
			err := r.Provider(p.provider).Remove(cctx, api.ProvisionRemoveRequest{Consumer: consumer, Interface: p.iface})
			cancel()
			if err != nil {
				r.log().Warn("remove an orphan; tried again at the next pass", "consumer", consumer, "interface", p.iface, "provider", p.provider, "err", err)
				continue
			}
			r.event(ctx, "deprovisioned", map[string]any{"consumer": consumer, "interface": p.iface, "provider": p.provider,
				"reason": "an orphan: the provider held it, and no deployed module requires it"})
		}
	}
}

// create asks w's provider for the resource and has the vault keep its credential; the
// record it returns (and stored) says how that went.
func (r *Reconciler) create(ctx context.Context, w Want, prev api.Provision, why string) api.Provision {
	next := api.Provision{Consumer: w.Consumer, Interface: w.Interface, Provider: w.Provider, Generation: prev.Generation, Options: w.Options}
	err := r.createAt(ctx, w)
	switch {
	case errors.Is(err, ErrUnavailable):
		next.State, next.Reason = StateWaiting, err.Error()
	case err != nil:
		next.State, next.Reason = StateFailed, err.Error()
	default:
		next.State, next.Generation = StateReady, prev.Generation+1
	}
	next = r.put(ctx, prev, prev.Consumer != "", next)
	meta := map[string]any{"consumer": w.Consumer, "interface": w.Interface, "provider": w.Provider}
	switch {
	case next.State == StateReady:
		meta["generation"], meta["reason"] = next.Generation, why
		r.event(ctx, "provisioned", meta)
		r.log().Info("provisioned", "consumer", w.Consumer, "interface", w.Interface, "provider", w.Provider, "generation", next.Generation, "why", why)
	case next.State == StateFailed && (prev.State != StateFailed || prev.Reason != next.Reason):
		meta["reason"] = next.Reason
		r.event(ctx, "provision-failed", meta)
		r.log().Warn("provision failed; tried again", "consumer", w.Consumer, "interface", w.Interface, "provider", w.Provider, "err", next.Reason)
	}
	return next
}

func (r *Reconciler) createAt(ctx context.Context, w Want) error {
	ctx, cancel := r.bounded(ctx) // the whole create: the provider's and the vault's work
	defer cancel()
	req := api.ProvisionCreateRequest{Consumer: w.Consumer, Interface: w.Interface, Options: w.Options}
	own := w.Provider == MeshProvider
	if !own {
		xkey, err := r.IntakeKey(ctx)
		if err != nil {
			return fmt.Errorf("the vault's intake key: %w", err)
		}
		req.XKey = xkey
	}
	reply, err := r.Provider(w.Provider).Create(ctx, req)
	if err != nil || own {
		return err
	}
	if err := r.Keep(ctx, w.Consumer, w.Interface, reply); err != nil {
		return fmt.Errorf("the vault did not keep the credential from %s: %w", w.Provider, err)
	}
	return nil
}

// deprovision removes rec's resource at its provider, has the vault forget its credential,
// and deletes the record.
func (r *Reconciler) deprovision(ctx context.Context, rec api.Provision, reason string) error {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	if rec.Provider != "" {
		err := r.Provider(rec.Provider).Remove(ctx, api.ProvisionRemoveRequest{Consumer: rec.Consumer, Interface: rec.Interface})
		if err != nil && !(errors.Is(err, ErrUnavailable) && rec.State != StateReady) {
			return err // a provider that never created it need not answer
		}
		if rec.Provider != MeshProvider {
			if err := r.Drop(ctx, rec.Consumer, rec.Interface); err != nil {
				return err
			}
		}
	}
	if err := r.Store.Delete(ctx, Key(rec.Consumer, rec.Interface)); err != nil {
		return err
	}
	if rec.State == StateReady {
		r.event(ctx, "deprovisioned", map[string]any{"consumer": rec.Consumer, "interface": rec.Interface, "provider": rec.Provider, "reason": reason})
	}
	r.log().Info("deprovisioned", "consumer", rec.Consumer, "interface", rec.Interface, "provider", rec.Provider, "reason", reason)
	return nil
}

// put stores next unless it says what prev (when had) says already; Since is kept while
// the state is.
func (r *Reconciler) put(ctx context.Context, prev api.Provision, had bool, next api.Provision) api.Provision {
	if had && prev.State == next.State && prev.Reason == next.Reason && prev.Provider == next.Provider && prev.Generation == next.Generation && maps.Equal(prev.Options, next.Options) {
		return prev
	}
	next.Since = time.Now().UTC()
	if had && prev.State == next.State && next.State != StateReady {
		next.Since = prev.Since
	}
	if err := r.Store.Put(ctx, next); err != nil {
		r.log().Warn("store a provision record", "consumer", next.Consumer, "interface", next.Interface, "err", err)
	}
	return next
}

func (r *Reconciler) event(ctx context.Context, action string, meta map[string]any) {
	if r.Event != nil {
		r.Event(ctx, action, meta)
	}
}

func (r *Reconciler) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}
