package controller

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/provision"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/vault"
)

// Provisioning, the controller's side (DESIGN §12): while this node holds the
// mesh-controller seat, a reconciler (package provision) resolves every requirement of the
// deployed modules to its provider, creates what is missing, and every provision-interval
// asks each provider what it holds. A module is declared waiting until its provisions are
// ready; each change declares its nodes again.

// provisionRetry is how soon a pass follows one that left a provision waiting (a provider
// not answering yet) — the time from a provider's start to its consumers' start.
const provisionRetry = time.Second

// provisionFailedRetry is how long a failed provision waits before it is tried again.
const provisionFailedRetry = 10 * time.Second

// provisions is the controller's provisioning state.
type provisions struct {
	interval time.Duration
	wake     chan struct{}

	mu      sync.Mutex
	store   *provision.KVStore
	records map[string]api.Provision // as the last pass left them; nil: not read yet
	rec     *provision.Reconciler
}

// loadProvisions reads the records from the bucket unless this holder has them: a
// declaration is composed from them, and one composed without them would stop every module
// that requires anything.
func (c *Controller) loadProvisions(ctx context.Context) error {
	c.prov.mu.Lock()
	loaded := c.prov.records != nil
	c.prov.mu.Unlock()
	if loaded {
		return nil
	}
	store, err := c.provisionStore(ctx)
	if err != nil {
		return err
	}
	if err := store.Load(ctx); err != nil {
		return err
	}
	all, err := store.All(ctx)
	if err != nil {
		return err
	}
	c.prov.mu.Lock()
	c.prov.records = all
	c.prov.mu.Unlock()
	return nil
}

// forgetProvisions drops what this holder knew of the records: another node may hold the
// seat before this one holds it again.
func (c *Controller) forgetProvisions() {
	c.prov.mu.Lock()
	defer c.prov.mu.Unlock()
	c.prov.records = nil
	if c.prov.store != nil {
		c.prov.store.Forget()
	}
}

// wakeProvisions asks for a pass now: a deployment, registration or choice changed.
func (c *Controller) wakeProvisions() {
	select {
	case c.prov.wake <- struct{}{}:
	default:
	}
}

// provisionStore opens mesh-provisions on first use.
func (c *Controller) provisionStore(ctx context.Context) (*provision.KVStore, error) {
	c.prov.mu.Lock()
	defer c.prov.mu.Unlock()
	if c.prov.store != nil {
		return c.prov.store, nil
	}
	s, err := provision.OpenStore(ctx, c.js, c.topo.replicas(), c.topo.budget.Provision)
	if err != nil {
		return nil, err
	}
	c.prov.store = s
	c.prov.rec = &provision.Reconciler{
		Store: s,
		Provider: func(seat string) provision.Provider {
			if seat == provision.MeshProvider {
				return provision.MeshKV{JS: c.js, Replicas: c.topo.replicas(), MaxBytes: c.topo.budget.Provision}
			}
			return provision.Seat{NC: c.nc, Name: seat, Node: c.node}
		},
		IntakeKey:   c.intakeKey,
		Keep:        c.keepProvision,
		Drop:        c.dropProvision,
		Event:       c.provisionEvent,
		Log:         c.log.With("part", "provisions"),
		RetryFailed: provisionFailedRetry,
	}
	return s, nil
}

// keepProvisioned reconciles provisions at once, whenever woken, every provisionRetry while
// one waits, and asks the providers what they hold every interval, while this node holds
// the controller seat (ctx).
func (c *Controller) keepProvisioned(ctx context.Context) {
	// Another node may have held the seat since this one last did: its records are read
	// again from the bucket (unsubscribe forgot them).
	if err := jsretry.Request(ctx, c.loadProvisions); err != nil {
		return // the seat was let go
	}
	holds := time.NewTicker(c.prov.interval)
	defer holds.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	askHolds := true
	for {
		pending, err := c.provisionPass(ctx, askHolds)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("provisions: pass failed; trying again", "err", err)
			pending = true
		}
		askHolds = false
		if pending {
			retry.Reset(provisionRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-c.prov.wake:
		case <-retry.C:
		case <-holds.C:
			askHolds = true
		}
	}
}

// provisionPass reconciles once and declares again the nodes of every consumer whose
// provisions changed.
func (c *Controller) provisionPass(ctx context.Context, holds bool) (bool, error) {
	store, err := c.provisionStore(ctx)
	if err != nil {
		return true, err
	}
	before, err := store.All(ctx)
	if err != nil {
		return true, err
	}
	res, err := c.prov.rec.Pass(ctx, c.wants(before), holds)
	if err != nil {
		return true, err
	}
	after, err := store.All(ctx)
	if err != nil {
		return true, err
	}
	c.prov.mu.Lock()
	if ctx.Err() == nil { // the seat let go meanwhile: forgetProvisions has run, or will
		c.prov.records = after
	}
	c.prov.mu.Unlock()
	// A consumer whose gate opened or closed, or whose credential is new, is declared again.
	moved := slices.Clone(res.Changed)
	for key, r := range after {
		if b, ok := before[key]; !ok || b.State != r.State || b.Generation != r.Generation || b.Provider != r.Provider {
			moved = append(moved, r.Consumer)
		}
	}
	if len(moved) > 0 {
		c.lock("declare after provisioning")
		var nodes []string
		servers := c.reg.Nodes()
		for _, consumer := range moved {
			if e, ok := c.reg.Get(consumer); ok {
				nodes = union(nodes, targets(e.Deployment, servers))
			}
		}
		c.declare(ctx, nodes)
		c.mu.Unlock()
	}
	return res.Pending, nil
}

// wants resolves the requirements of every deployed module; a consumer provisioned by one
// of several providers keeps it unless the operator chose another.
func (c *Controller) wants(records map[string]api.Provision) []provision.Want {
	var out []provision.Want
	for _, e := range c.reg.List() {
		if e.Deployment == nil {
			continue
		}
		choices := maps.Clone(e.Providers)
		for _, iface := range e.Manifest.Requires {
			r, ok := records[provision.Key(e.Module, iface)]
			if _, chosen := choices[iface]; !chosen && ok && r.Provider != "" {
				if choices == nil {
					choices = map[string]string{}
				}
				choices[iface] = r.Provider
			}
		}
		out = append(out, provision.Resolve(e.Manifest, c.reg.Catalogue(e.Module), choices)...)
	}
	return out
}

// provisionGate returns a deployed module's ready provisions, and the first one it waits on
// ("postgres from postgres"), as its declaration says them.
func (c *Controller) provisionGate(e *registry.Entry) ([]deploy.Provision, string) {
	c.prov.mu.Lock()
	defer c.prov.mu.Unlock()
	var ready []deploy.Provision
	for _, w := range provision.Resolve(e.Manifest, c.reg.Catalogue(e.Module), e.Providers) {
		r, ok := c.prov.records[w.Key()]
		if !ok || r.State != provision.StateReady {
			from := cmp.Or(r.Provider, w.Provider, "a provider")
			return nil, w.Interface + " from " + from
		}
		ready = append(ready, deploy.Provision{Interface: w.Interface, Provider: r.Provider, Generation: r.Generation})
	}
	return ready, ""
}

// intakeKey asks the vault for its intake xkey; a vault that does not answer yet is a
// provision that waits, not one that failed.
func (c *Controller) intakeKey(ctx context.Context) (string, error) {
	key, err := vault.IntakeKey(ctx, c.nc, api.VaultCallerNode)
	if err != nil && !errors.Is(err, vault.ErrRefused) {
		return "", fmt.Errorf("%w: %w", provision.ErrUnavailable, err)
	}
	return key, err
}

// keepProvision hands the vault a provider's sealed credential for consumer.
func (c *Controller) keepProvision(ctx context.Context, consumer, iface string, r api.ProvisionCreateReply) error {
	_, err := vault.Call(ctx, c.nc, api.VaultVerbProvision, api.VaultCallerNode,
		api.VaultRequest{Owner: consumer, Name: iface, Sealed: r.Sealed, Sender: r.Sender}, nil)
	return err
}

// dropProvision has the vault forget consumer's credential of iface.
func (c *Controller) dropProvision(ctx context.Context, consumer, iface string) error {
	_, err := vault.Call(ctx, c.nc, api.VaultVerbUnprovision, api.VaultCallerNode, api.VaultRequest{Owner: consumer, Name: iface}, nil)
	return err
}

// provisionEvent records a provisioning change as the controller's event, signed by this
// node: metadata only, never a credential.
func (c *Controller) provisionEvent(ctx context.Context, action string, meta map[string]any) {
	meta["node"] = c.node
	body, _ := json.Marshal(meta)
	subject := manifest.SeatEventSubject(manifest.ControllerSeat, action)
	if err := c.publish(ctx, subject, body, ""); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Error("record a provisioning event", "action", action, "err", err)
	}
}

// handleProvisions answers `meshnode provisions`: one row per deployed consumer and
// required interface, as the last pass left it.
func (c *Controller) handleProvisions(ctx context.Context, _ []byte) any {
	reply := api.ProvisionsReply{Provisions: []api.Provision{}}
	store, err := c.provisionStore(ctx)
	if err != nil {
		reply.Error = err.Error()
		return reply
	}
	records, err := store.All(ctx)
	if err != nil {
		reply.Error = err.Error()
		return reply
	}
	for _, w := range c.wants(records) {
		r, ok := records[w.Key()]
		if !ok {
			r = api.Provision{Consumer: w.Consumer, Interface: w.Interface, Provider: w.Provider, State: provision.StateWaiting,
				Reason: w.Problem}
			if r.Reason == "" {
				r.Reason = "not created yet"
			}
		}
		reply.Provisions = append(reply.Provisions, r)
	}
	slices.SortFunc(reply.Provisions, func(a, b api.Provision) int {
		return cmp.Or(strings.Compare(a.Consumer, b.Consumer), strings.Compare(a.Interface, b.Interface))
	})
	return reply
}

// provide records which seat provides a module's required interface: needed when several
// seats provide it, and the way to move a consumer to another provider (the old one removes
// its resource, the new one creates it, and the module restarts with the new credential).
func (c *Controller) provide(ctx context.Context, req api.ProvideRequest) (api.ProvideReply, error) {
	c.lock("provisions pin")
	defer c.mu.Unlock()
	e, ok := c.reg.Get(req.Module)
	if !ok {
		return api.ProvideReply{}, fmt.Errorf("provisions pin: module %q is not registered; `meshnode module ls` lists those that are", req.Module)
	}
	if !slices.Contains(e.Manifest.Requires, req.Interface) || slices.Contains(manifest.MeshProvided, req.Interface) {
		return api.ProvideReply{}, fmt.Errorf("provisions pin: module %s does not require %s from a seat (it requires %v)", req.Module, req.Interface, e.Manifest.Requires)
	}
	providers := manifest.Providers(req.Interface, append(c.reg.Catalogue(e.Module), e.Manifest))
	if !slices.Contains(providers, req.Provider) {
		return api.ProvideReply{}, fmt.Errorf("provisions pin: seat %q does not provide %s; those that do: %v", req.Provider, req.Interface, providers)
	}
	reply := api.ProvideReply{Module: e.Module, Interface: req.Interface, Provider: req.Provider, Previous: e.Providers[req.Interface]}
	if reply.Previous == req.Provider {
		return reply, nil
	}
	rec := e.Record
	rec.Providers = maps.Clone(rec.Providers)
	if rec.Providers == nil {
		rec.Providers = map[string]string{}
	}
	rec.Providers[req.Interface] = req.Provider
	if err := c.putWithEvent(ctx, e, rec, registry.EventProviderChosen, map[string]any{
		"module": e.Module, "interface": req.Interface, "provider": req.Provider, "previous": reply.Previous, "node": c.node}); err != nil {
		return api.ProvideReply{}, err
	}
	c.wakeProvisions()
	return reply, nil
}
