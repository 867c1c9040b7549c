package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
)

// controllerTimeout bounds one controller request's work.
const controllerTimeout = 30 * time.Second

// controller answers the mesh-controller's tools on this node and reconciles topology. It
// serialises registrations: the catalogue checks hold only if no other write interleaves.
type controller struct {
	log  *slog.Logger
	nc   *nats.Conn // the node's own: writes and requests to the vault
	resp *nats.Conn // answers the tools: may publish only to inboxes
	reg  *registry.Registry
	topo *topology
	node string

	// seats lists every seat for the seats tool.
	seats func(context.Context) []registry.SeatStatus

	mu     sync.Mutex // serialises registrations
	subsMu sync.Mutex
	subs   []*nats.Subscription
}

// start subscribes to the controller's tools (queue group mesh-controller): the node does
// this while it holds the mesh-controller seat.
func (c *controller) start() error {
	c.subsMu.Lock()
	defer c.subsMu.Unlock()
	if len(c.subs) > 0 {
		return nil
	}
	body := func(h func(context.Context, []byte) any) func(context.Context, *nats.Msg) any {
		return func(ctx context.Context, m *nats.Msg) any { return h(ctx, m.Data) }
	}
	for subject, h := range map[string]func(context.Context, *nats.Msg) any{
		registry.RegisterSubject: body(c.handleRegister),
		registry.RemoveSubject:   body(c.handleRemove),
		registry.ListSubject:     body(c.handleList),
		registry.WhoamiSubject:   c.handleWhoami,
		registry.SeatsSubject:    body(c.handleSeats),
	} {
		sub, err := c.resp.QueueSubscribe(subject, registry.ControllerSeat, func(m *nats.Msg) {
			ctx, cancel := context.WithTimeout(context.Background(), controllerTimeout)
			defer cancel()
			reply := h(ctx, m)
			if reply == nil {
				return // not answered: see the handler
			}
			b, _ := json.Marshal(reply)
			if err := m.Respond(b); err != nil {
				c.log.Warn("controller reply failed", "subject", m.Subject, "err", err)
			}
		})
		if err != nil {
			c.unsubscribe()
			return fmt.Errorf("subscribe %s: %w", subject, err)
		}
		c.subs = append(c.subs, sub)
	}
	return c.resp.Flush()
}

// stop unsubscribes: the node no longer holds the mesh-controller seat, or is stopping.
func (c *controller) stop() {
	c.subsMu.Lock()
	defer c.subsMu.Unlock()
	c.unsubscribe()
}

func (c *controller) unsubscribe() {
	for _, s := range c.subs {
		s.Unsubscribe()
	}
	c.subs = nil
}

func (c *controller) handleSeats(ctx context.Context, _ []byte) any {
	return registry.SeatsReply{Seats: c.seats(ctx)}
}

// reconcileAll brings the topology of every registered module up to date (at start).
func (c *controller) reconcileAll(ctx context.Context) error {
	if err := c.topo.ensureMesh(ctx); err != nil {
		return err
	}
	for _, e := range c.reg.List() {
		if err := c.topo.ensureModule(ctx, e.Derivation); err != nil {
			return fmt.Errorf("module %s: %w", e.Module, err)
		}
	}
	return nil
}

func (c *controller) handleRegister(ctx context.Context, data []byte) any {
	var req registry.RegisterRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return registry.RegisterReply{Error: "register: the request is not JSON: " + err.Error()}
	}
	reply, err := c.register(ctx, req)
	if err != nil {
		reply.Error = err.Error()
		var rs manifest.Refusals
		if errors.As(err, &rs) {
			reply.Refusals = rs
			reply.Error = fmt.Sprintf("manifest refused (%d %s)", len(rs), plural(len(rs), "reason", "reasons"))
		}
	}
	return reply
}

// register validates a manifest against the registry, reconciles its topology, stores it and
// mints the module's identity if it is new.
func (c *controller) register(ctx context.Context, req registry.RegisterRequest) (registry.RegisterReply, error) {
	m, err := manifest.Parse([]byte(req.Manifest))
	if err != nil {
		return registry.RegisterReply{}, err
	}
	d, err := m.Derive()
	if err != nil {
		return registry.RegisterReply{}, err
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	prev, exists := c.reg.Get(m.Module)
	var prevManifest *manifest.Manifest
	if exists {
		prevManifest = prev.Manifest
	}
	if err := manifest.CheckCatalogue(m, c.reg.Catalogue(m.Module), prevManifest); err != nil {
		return registry.RegisterReply{}, err
	}

	now := time.Now().UTC()
	rec := registry.Record{Module: m.Module, Manifest: req.Manifest, Registered: now, Updated: now, Fingerprints: map[string]string{}}
	for _, s := range d.Seats {
		rec.Fingerprints[s.Name] = s.Fingerprint
	}
	derived, _ := json.Marshal(d)
	reply := registry.RegisterReply{Module: m.Module, Derived: derived}
	var revision uint64
	if exists {
		rec.PublicKey, rec.Registered, revision = prev.PublicKey, prev.Registered, prev.Revision
	} else {
		if req.XKey == "" {
			return registry.RegisterReply{}, errors.New("register: the request carries no xkey to seal the new module's seed to; use `meshnode module register`, which sends one")
		}
		// The vault mints the module's identity and seals it to the caller's xkey: the
		// controller sees only the public key.
		var vr vault.Reply
		b, _ := json.Marshal(vault.Request{XKey: req.XKey, Owner: m.Module})
		msg, err := c.nc.RequestWithContext(ctx, vault.ToolSubject(vault.VerbIdentity, vault.CallerNode), b)
		if err != nil {
			return registry.RegisterReply{}, fmt.Errorf("register: ask the vault for %s's identity: %w", m.Module, err)
		}
		if err := json.Unmarshal(msg.Data, &vr); err != nil || vr.Error != "" {
			return registry.RegisterReply{}, fmt.Errorf("register: the vault refused %s's identity: %s%v", m.Module, vr.Error, err)
		}
		rec.PublicKey, reply.SealedSeed, reply.SenderXKey = vr.PublicKey, vr.Sealed, vr.Sender
		reply.Created = true
	}
	reply.PublicKey = rec.PublicKey

	// Topology first: once the record is stored the module may connect, and its consumers
	// must then exist.
	if err := c.topo.ensureModule(ctx, d); err != nil {
		return registry.RegisterReply{}, err
	}
	if _, err := c.reg.Put(ctx, rec, revision); err != nil {
		return registry.RegisterReply{}, err
	}
	if exists {
		if reply.Kept, err = c.topo.retire(ctx, prev.Derivation, d); err != nil {
			c.log.Error("retire topology of previous registration", "module", m.Module, "err", err)
		}
	}
	c.log.Info("module registered", "module", m.Module, "created", reply.Created, "key", rec.PublicKey)
	return reply, nil
}

func (c *controller) handleRemove(ctx context.Context, data []byte) any {
	var req registry.RemoveRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return registry.RemoveReply{Error: "remove: the request is not JSON: " + err.Error()}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.reg.Get(req.Module)
	if !ok {
		return registry.RemoveReply{Error: fmt.Sprintf("module %q is not registered; `meshnode module ls` lists those that are", req.Module)}
	}
	var users []string
	for _, o := range c.reg.List() {
		for _, s := range e.Manifest.Seats {
			if o.Module != e.Module && slices.Contains(o.Manifest.Uses, s.Name) {
				users = append(users, fmt.Sprintf("%s uses seat %s", o.Module, s.Name))
			}
		}
	}
	if err := c.reg.Delete(ctx, e.Module, e.Revision); err != nil {
		return registry.RemoveReply{Error: err.Error()}
	}
	kept, err := c.topo.retire(ctx, e.Derivation, nil)
	if err != nil {
		c.log.Error("retire topology of removed module", "module", e.Module, "err", err)
	}
	c.log.Info("module removed", "module", e.Module, "seat_users", users)
	return registry.RemoveReply{Module: e.Module, Kept: kept}
}

func (c *controller) handleList(context.Context, []byte) any {
	reply := registry.ListReply{Modules: []registry.ModuleInfo{}}
	for _, e := range c.reg.List() {
		info := registry.ModuleInfo{
			Module: e.Module, PublicKey: e.PublicKey,
			Emits: e.Manifest.Emits, Consumes: e.Manifest.Consumes, Tools: e.Manifest.Tools, Uses: e.Manifest.Uses,
			Fingerprints: e.Fingerprints, Registered: e.Registered, Updated: e.Updated,
			Revision: e.Revision, Manifest: e.Record.Manifest,
		}
		for _, s := range e.Manifest.Seats {
			info.Seats = append(info.Seats, s.Name)
		}
		reply.Modules = append(reply.Modules, info)
	}
	return reply
}

// handleWhoami tells a connection which module its key is. It answers only on the inbox of
// the key asked about (_INBOX.<key>.…) or of its module (_INBOX.<module>.…), which only that
// key's connections may subscribe to: a connection learns about its own key, never another
// module's declarations or secrets.
func (c *controller) handleWhoami(_ context.Context, m *nats.Msg) any {
	var req registry.WhoamiRequest
	if err := json.Unmarshal(m.Data, &req); err != nil || req.PublicKey == "" {
		return nil // whose inbox the reply names is unknown: nothing is answered
	}
	e, ok := c.reg.ByKey(req.PublicKey)
	if !repliesTo(m.Reply, registry.BootstrapInbox(req.PublicKey)) && !(ok && repliesTo(m.Reply, manifest.InboxPrefix(e.Module))) {
		c.log.Debug("whoami: not answered outside the asking key's inbox", "key", req.PublicKey, "reply", m.Reply)
		return nil
	}
	if !ok {
		return registry.WhoamiReply{Error: "no module is registered with key " + req.PublicKey}
	}
	reply := registry.WhoamiReply{
		Module: e.Module, Node: c.node,
		Emits: e.Manifest.Emits, Consumes: e.Manifest.Consumes, Tools: e.Manifest.Tools, Secrets: e.Manifest.Secrets,
	}
	for _, s := range e.Manifest.Uses {
		reply.Uses = append(reply.Uses, c.reg.Seat(s))
	}
	for _, s := range e.Manifest.Seats {
		reply.Seats = append(reply.Seats, c.reg.Seat(s.Name))
	}
	return reply
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
