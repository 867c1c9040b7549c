package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/throttle"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// controllerTimeout bounds one controller request's work.
const controllerTimeout = 30 * time.Second

// slowLock and slowRequest are how long a wait for the controller's lock, and a request's
// answer, take before they are logged. A request that waits behind a loop riding out a
// stream's election (a sweep of every node's declaration asks STATE once a node), or that
// waits out one itself, says so and names what it waited behind: a local CI run's deploy got
// no answer within the CLI's 30 s after two of five servers were killed, and nothing in the
// controller's log said where it waited.
var (
	slowLock    = 5 * time.Second
	slowRequest = 10 * time.Second
)

// lock takes c.mu for what (a request's verb, a loop's name). A wait longer than slowLock is
// logged with what held the lock last.
func (c *Controller) lock(what string) {
	start := time.Now()
	c.mu.Lock()
	if waited := time.Since(start); waited > slowLock {
		c.log.Warn("waited for the controller's lock", "for", what, "waited", waited.Round(time.Millisecond), "held_by", c.holder)
	}
	c.holder = what
}

// ErrClosed is Start's error once the controller is closed: its node is stopping.
var ErrClosed = errors.New("the controller is closed: its node is stopping")

// Config is what a controller works with: the node's connections, key and registry, and the
// seams to the node's other parts. Every field is required unless it says otherwise.
type Config struct {
	Log *slog.Logger
	// Node is this node's name: the controller's events and declarations are its own.
	Node string
	// Conn is the node's own connection: writes, and requests to the vault and the
	// cascade's seats. JS is its JetStream.
	Conn *nats.Conn
	JS   jetstream.JetStream
	// Responder answers the tools: it may publish only to inboxes.
	Responder *nats.Conn
	// Gate rate-limits whoami.
	Gate *throttle.Gate
	// Quotas is each module's use of EVENTS against its quota, as list reports it (the
	// node's admitter); nil: none reported.
	Quotas   func(modules []string) []api.QuotaUse
	Registry *registry.Registry
	// Sign is the node's key: the registry's events and the declarations are the node's own.
	Sign *envelope.SigningKey
	// Servers returns a server of the mesh's public key: what declarations are checked with.
	Servers deploy.ServerKey
	// Replicas is how many copies of a stream or bucket the mesh keeps now: what one it
	// creates is made with (it follows the number of servers; package replication).
	Replicas func() int
	// EventsMaxAge is how long EVENTS keeps an event; zero: for ever.
	EventsMaxAge time.Duration
	// Budget is the byte limits of the mesh's streams; zero: none.
	Budget Budget
	// ProvisionInterval is how often the providers are asked what they hold.
	ProvisionInterval time.Duration
	// Answered, when set, is told how long each answered tool took (the node's metrics).
	Answered func(subject string, took time.Duration)
	// Publish publishes body on subject as this node's own (x-source and x-node the node),
	// signed by it and caused by causation ("": none), once JetStream has stored it.
	Publish func(ctx context.Context, subject string, body []byte, causation string) error
}

// Seat is what the controller asks of the seat service while this node holds the
// mesh-controller seat (Start).
type Seat struct {
	// List lists every seat, for the seats tool.
	List func(context.Context) []api.SeatStatus
	// Epoch is the epoch of this node's lease of mesh-controller: 0 once it holds it no
	// more (the lease bucket's mirror can lag; the seat runner's record cannot).
	Epoch func() uint64
}

// Controller answers the mesh-controller's tools on this node and reconciles topology. It
// serialises registrations: the catalogue checks hold only if no other write interleaves.
type Controller struct {
	log  *slog.Logger
	nc   *nats.Conn // the node's own: writes and requests to the vault
	resp *nats.Conn // answers the tools: may publish only to inboxes
	gate *throttle.Gate
	// quotas reports modules' use of EVENTS (Config.Quotas).
	quotas func([]string) []api.QuotaUse
	reg    *registry.Registry
	topo   *Topology
	node   string
	js     jetstream.JetStream  // publishes the registry's events
	sign   *envelope.SigningKey // the node's key: the registry's events are the node's own

	// sweepNow wakes the outbox sweeper.
	sweepNow chan struct{}

	// seat is the seat service's, set while this node holds (or last held) the seat.
	seat atomic.Pointer[Seat]

	answered func(subject string, took time.Duration)
	publish  func(ctx context.Context, subject string, body []byte, causation string) error

	// reports counts the report jobs taken from the seat's work queue (reports.go).
	reports *prometheus.CounterVec

	// deps is the artifact store; publisher writes nodes' declarations on STATE, signed by
	// this node, at the controller seat's epoch (deployments.go).
	deps      deployments
	publisher *deploy.Publisher
	// hosts are the hosts' latest reports, by node (reports.go), and published the
	// declarations this holder published or found genuine on STATE: what `ps` shows.
	hostsMu   sync.Mutex
	hosts     map[string]host.Report
	published map[string]deploy.Declaration
	// casc are the build cascades under way and the latest builds (cascade.go).
	casc cascades
	// prov is the provisioning of the deployed modules' requirements (provisions.go).
	prov provisions

	mu sync.Mutex // serialises registrations; taken with lock
	// holder is what took mu last (lock): a long wait for it names what it waited behind.
	holder string
	// dead counts the consumers DEAD keeps a share for (checkDead), and catalogue indexes the
	// registered manifests (the catalogue check), both under mu.
	dead      deadTally
	catalogue *manifest.Catalogue

	// loops run while this node holds the seat: the sweeper, the provisioner, the
	// declarations, the cascade's and the reports' consumers.
	loops []func(context.Context)

	// ctx ends at Close: the tools' answers and the loops end with it. wg counts the
	// loops' holdings and the answers in flight; closed, under wgMu, stops new ones once
	// Close waits, so that wg.Add never races wg.Wait.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	wgMu   sync.Mutex
	closed bool

	subsMu sync.Mutex // the tools' subscriptions and the current holding
	subs   []*nats.Subscription
	held   *holding
}

// holding is one holding of the seat: its loops' context, ended when the seat is let go,
// and done, closed once every loop has returned.
type holding struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// New makes the controller of a node; it serves nothing until Start.
func New(cfg Config) *Controller {
	if cfg.Replicas == nil {
		cfg.Replicas = func() int { return 1 }
	}
	c := &Controller{
		log: cfg.Log, nc: cfg.Conn, resp: cfg.Responder, gate: cfg.Gate, reg: cfg.Registry, node: cfg.Node,
		quotas: cfg.Quotas, js: cfg.JS, sign: cfg.Sign,
		topo: &Topology{
			js:           cfg.JS,
			node:         cfg.Node,
			replicas:     cfg.Replicas,
			eventsMaxAge: cfg.EventsMaxAge,
			budget:       cfg.Budget,
			sites:        cfg.Registry.Sites,
		},
		sweepNow: make(chan struct{}, 1),
		answered: cfg.Answered, publish: cfg.Publish,
		reports:   newReportCounts(),
		publisher: &deploy.Publisher{JS: cfg.JS, Key: cfg.Sign, Controller: cfg.Node, Servers: cfg.Servers},
		hosts:     map[string]host.Report{},
		published: map[string]deploy.Declaration{},
		casc:      cascades{running: map[string]*cascade{}, lastCommit: map[string]string{}},
		prov:      provisions{interval: cfg.ProvisionInterval, wake: make(chan struct{}, 1)},
	}
	c.loops = []func(context.Context){c.keepProvisioned, c.consumeCascade, c.sweepOutboxes, c.keepDeclared, c.consumeReports}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// Topology is the controller's topology: the node makes and repairs the mesh's streams with
// it too (at start, and when drift finds them gone).
func (c *Controller) Topology() *Topology { return c.topo }

// Reports is the controller's metric of the reports it took.
func (c *Controller) Reports() prometheus.Collector { return c.reports }

// Start subscribes to the controller's tools (queue group mesh-controller) and starts its
// loops: the node does this when it has become the mesh-controller seat's holder. The loops
// of a previous holding start again only once they have ended: losing and regaining the
// seat at once must not run two sets.
func (c *Controller) Start(seat Seat) error {
	c.subsMu.Lock()
	defer c.subsMu.Unlock()
	if len(c.subs) > 0 {
		return nil
	}
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	c.seat.Store(&seat)
	body := func(h func(context.Context, []byte) any) func(context.Context, *nats.Msg) any {
		return func(ctx context.Context, m *nats.Msg) any { return h(ctx, m.Data) }
	}
	for subject, h := range map[string]func(context.Context, *nats.Msg) any{
		api.RegisterSubject:     body(c.handleRegister),
		api.RemoveSubject:       body(c.handleRemove),
		api.ListSubject:         body(c.handleList),
		api.PinSubject:          jsonTool("pin", c.pin),
		api.DeploySubject:       jsonTool("deploy", c.deploy),
		api.UndeploySubject:     jsonTool("undeploy", c.undeploy),
		api.PsSubject:           body(c.handlePs),
		api.BuildsSubject:       body(c.handleBuilds),
		api.ProvisionsSubject:   body(c.handleProvisions),
		api.ProvideSubject:      jsonTool("provisions pin", c.provide),
		manifest.WhoamiSubjects: c.handleWhoami,
		api.SeatListSubject:     body(c.handleSeats),
	} {
		sub, err := c.resp.QueueSubscribe(subject, manifest.ControllerSeat, func(m *nats.Msg) {
			if !strings.HasPrefix(m.Reply, "_INBOX.") {
				// A request has an inbox to answer; a message without one is no caller's
				// (a stream consumer's delivery aimed here, say), and changes nothing.
				c.log.Debug("a controller tool message without an inbox is ignored", "subject", m.Subject, "reply", m.Reply)
				return
			}
			if !c.track() {
				return // closing: not answered
			}
			defer c.wg.Done()
			arrived := time.Now()
			ctx, cancel := context.WithTimeout(c.ctx, controllerTimeout)
			defer cancel()
			reply := h(ctx, m)
			took := time.Since(arrived)
			if took > slowRequest {
				c.log.Warn("slow controller request", "subject", m.Subject, "took", took.Round(time.Millisecond), "answered", reply != nil)
			}
			if reply == nil {
				return // not answered: see the handler
			}
			b, _ := json.Marshal(reply)
			if err := m.Respond(b); err != nil {
				c.log.Warn("controller reply failed", "subject", m.Subject, "err", err)
			}
			if c.answered != nil {
				c.answered(m.Subject, took)
			}
		})
		if err != nil {
			c.unsubscribe()
			return fmt.Errorf("subscribe %s: %w", subject, err)
		}
		c.subs = append(c.subs, sub)
	}
	if !c.startLoops() {
		c.unsubscribe()
		return ErrClosed
	}
	return c.resp.Flush()
}

// track counts one more piece of work Close waits for; false once Close waits.
func (c *Controller) track() bool {
	c.wgMu.Lock()
	defer c.wgMu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

// startLoops starts a holding's loops once the previous holding's have returned (under
// subsMu); false once Close waits.
func (c *Controller) startLoops() bool {
	if !c.track() {
		return false
	}
	ctx, cancel := context.WithCancel(c.ctx)
	prev, h := c.held, &holding{cancel: cancel, done: make(chan struct{})}
	c.held = h
	go func() {
		defer c.wg.Done()
		defer close(h.done)
		if prev != nil {
			// Not waited for in Stop: it runs in the seat's hooks, which must be quick.
			<-prev.done
		}
		if ctx.Err() != nil {
			return // let go (or closed) meanwhile
		}
		var g errgroup.Group
		for _, loop := range c.loops {
			g.Go(func() error {
				loop(ctx)
				return nil
			})
		}
		g.Wait()
	}()
	return true
}

// jsonTool adapts a controller verb to its tool: the request decoded from JSON (one that is
// not is refused in verb's reply), the verb's error set in its reply.
func jsonTool[Req, Reply any, P interface {
	*Reply
	SetError(string)
}](verb string, f func(context.Context, Req) (Reply, error)) func(context.Context, *nats.Msg) any {
	return func(ctx context.Context, m *nats.Msg) any {
		var req Req
		var reply Reply
		if err := json.Unmarshal(m.Data, &req); err != nil {
			P(&reply).SetError(verb + ": the request is not JSON: " + err.Error())
			return reply
		}
		reply, err := f(ctx, req)
		if err != nil {
			P(&reply).SetError(err.Error())
		}
		return reply
	}
}

// Stop unsubscribes and ends the loops, without waiting for them: the node no longer holds
// the mesh-controller seat (the next Start waits for them).
func (c *Controller) Stop() {
	c.subsMu.Lock()
	defer c.subsMu.Unlock()
	c.unsubscribe()
}

// Close stops, and waits for the loops and the answers in flight to end: the node is
// closing. Start fails from now on.
func (c *Controller) Close() error {
	c.Stop()
	c.wgMu.Lock()
	c.closed = true
	c.wgMu.Unlock()
	c.cancel()
	c.wg.Wait()
	return nil
}

func (c *Controller) unsubscribe() {
	for _, s := range c.subs {
		s.Unsubscribe()
	}
	c.subs = nil
	if c.held != nil {
		c.held.cancel()
	}
	c.forgetProvisions()
}

func (c *Controller) handleSeats(ctx context.Context, _ []byte) any {
	return api.SeatListReply{Seats: c.seat.Load().List(ctx)}
}

// epoch is the epoch of this node's lease of the seat: 0 when it holds none.
func (c *Controller) epoch() uint64 {
	if s := c.seat.Load(); s != nil {
		return s.Epoch()
	}
	return 0
}

// ReconcileAll brings the mesh's streams and buckets, and the topology of every registered
// module, up to date (at start). The mesh's part and each module's are retried on their own
// (jsretry.Request): an attempt is bounded at seconds, and with 10,000 modules an attempt of
// the whole began again each time and never finished, so the node did not start (issue 37).
func (c *Controller) ReconcileAll(ctx context.Context) error {
	if err := jsretry.Request(ctx, c.reconcileMesh); err != nil {
		return err
	}
	// Several modules at a time: each is a few JetStream round trips, and one after the
	// other a node's start waited 3.5 ms a module (35 s for 10,000).
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(reconcileWorkers)
	for _, e := range c.reg.List() {
		g.Go(func() error {
			err := c.ensureModule(gctx, e.Derivation)
			if err != nil {
				return fmt.Errorf("module %s: %w", e.Module, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// reconcileMesh brings the mesh's streams and buckets up to date: ReconcileAll's part
// without modules.
func (c *Controller) reconcileMesh(ctx context.Context) error {
	if err := c.topo.EnsureMesh(ctx); err != nil {
		return err
	}
	// The mesh's own seats' work queues, derived from the built-in manifest like any
	// module's: work sent to them waits for their holder.
	if err := c.topo.EnsureModule(ctx, manifest.Builtin()); err != nil {
		return fmt.Errorf("the mesh's own seats: %w", err)
	}
	if _, err := c.artifacts(ctx); err != nil {
		return err
	}
	if _, err := build.CreateSources(ctx, c.js, c.topo.replicas()); err != nil {
		return fmt.Errorf("object store %s: %w", build.SourcesBucket, err)
	}
	_, err := c.provisionStore(ctx)
	return err
}

// ensureModule makes or updates d's topology, asked again while JetStream settles (a mesh
// just formed may not have placed its peers yet): every reconcile of a module goes through it.
func (c *Controller) ensureModule(ctx context.Context, d *manifest.Derivation) error {
	return jsretry.Request(ctx, func(ctx context.Context) error { return c.topo.EnsureModule(ctx, d) })
}

// reconcileWorkers is how many modules' topologies ReconcileAll reconciles at once.
const reconcileWorkers = 16

func (c *Controller) handleRegister(ctx context.Context, data []byte) any {
	var req api.RegisterRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return api.RegisterReply{Error: "register: the request is not JSON: " + err.Error()}
	}
	reply, err := c.register(ctx, req)
	if err != nil {
		reply.Error = err.Error()
		var rs manifest.Refusals
		if errors.As(err, &rs) {
			reply.Error = fmt.Sprintf("manifest refused (%d %s)", len(rs), plural(len(rs), "reason", "reasons"))
			if len(rs) > maxReplyRefusals {
				// A manifest of thousands of bad names must not make a reply over the
				// payload limit: `meshnode module check` lists every one, locally.
				more := len(rs) - maxReplyRefusals
				rs = append(rs[:maxReplyRefusals:maxReplyRefusals], manifest.Refusal{
					Reason:  fmt.Sprintf("and %d more %s", more, plural(more, "refusal", "refusals")),
					Instead: "run `meshnode module check FILE` to see them all",
				})
			}
			reply.Refusals = rs
		}
	}
	return reply
}

// Bounds of a register reply, so that it fits the bus's payload whatever the manifest: the
// refusals it lists, and the derivation it carries (in bytes of JSON; a larger one is left
// out, and `meshnode module show FILE` prints it).
const (
	maxReplyRefusals = 100
	maxReplyDerived  = 256 << 10
)

// register validates a manifest against the registry, reconciles its topology, stores it and
// mints the module's identity if it is new.
func (c *Controller) register(ctx context.Context, req api.RegisterRequest) (api.RegisterReply, error) {
	// Refused before any YAML work: a manifest over the limit makes a reply and a record that
	// do not fit the bus's payload.
	if err := manifest.CheckSize(len(req.Manifest)); err != nil {
		return api.RegisterReply{}, err
	}
	m, err := manifest.Parse([]byte(req.Manifest))
	if err != nil {
		return api.RegisterReply{}, err
	}

	c.lock("register")
	defer c.mu.Unlock()
	prev, exists := c.reg.Get(m.Module)
	var prevManifest *manifest.Manifest
	var pins map[string]string
	if exists {
		prevManifest = prev.Manifest
		pins = c.keptPins(m, prev.Pins)
	}
	d, err := m.DeriveWith(pins)
	if err != nil {
		return api.RegisterReply{}, err
	}
	// One listing for the three checks against the registry (catalogue, DEAD, seat queues).
	entries := c.reg.List()
	c.catalogue = syncCatalogue(c.catalogue, entries)
	if err := manifest.CheckCatalogueBound(m, c.catalogue, prevManifest); err != nil {
		return api.RegisterReply{}, err
	}
	if err := manifest.CheckBindings(m, c.bindings(m)); err != nil {
		return api.RegisterReply{}, err
	}
	if err := c.checkDead(m.Module, d, entries); err != nil {
		return api.RegisterReply{}, err
	}
	if err := c.checkSeats(m.Module, d, entries); err != nil {
		return api.RegisterReply{}, err
	}

	now := time.Now().UTC()
	rec := registry.Record{Module: m.Module, Manifest: req.Manifest, Registered: now, Updated: now, Fingerprints: map[string]string{},
		Bound: c.bind(m, pins), Pins: pins}
	for _, s := range d.Seats {
		rec.Fingerprints[s.Name] = s.Fingerprint
	}
	derived, _ := json.Marshal(d)
	if len(derived) > maxReplyDerived {
		derived = nil
	}
	reply := api.RegisterReply{Module: m.Module, Derived: derived}
	var revision uint64
	if req.RotateKey && !exists {
		return api.RegisterReply{}, fmt.Errorf("register: module %s is not registered, so it has no key to rotate; register it without --rotate-key", m.Module)
	}
	if exists {
		rec.PublicKey, rec.Registered, revision = prev.PublicKey, prev.Registered, prev.Revision
		rec.Deployment, rec.Providers = prev.Deployment, prev.Providers
	}
	if !exists || req.RotateKey {
		// A new module, or a new key for one whose seed was lost: the vault mints the
		// identity and seals it to the caller's xkey; the controller sees only the public
		// key. Storing a new key kicks the old key's connections (the registry's change
		// callback).
		vr, err := c.mintIdentity(ctx, m.Module, req.XKey)
		if err != nil {
			return api.RegisterReply{}, err
		}
		rec.PublicKey, reply.SealedSeed, reply.SenderXKey = vr.PublicKey, vr.Sealed, vr.Sender
		reply.Created, reply.Rotated = !exists, exists
	}
	reply.PublicKey = rec.PublicKey
	if exists {
		rec.Outbox = prev.Outbox
	} else if gone, ok := c.reg.Leaving(m.Module); ok {
		// Registered again while its removal's event waits: the new record replaces the
		// old one and keeps that event.
		rec.Outbox, revision = gone.Outbox, gone.Revision
	}
	if len(rec.Outbox) >= outbox.Max {
		return api.RegisterReply{}, fmt.Errorf("register: module %s has %d changes whose events are not recorded yet, and none is stored without its event: is EVENTS full or without a leader (`meshnode status`)?", m.Module, len(rec.Outbox))
	}
	ev, err := outbox.New(registry.EventRegistered, c.node, map[string]any{
		"module": m.Module, "public_key": rec.PublicKey, "created": reply.Created, "rotated": reply.Rotated, "node": c.node})
	if err != nil {
		return api.RegisterReply{}, err
	}
	rec.Outbox = append(rec.Outbox, ev)

	// Topology first: once the record is stored the module may connect, and its consumers
	// must then exist. Through jsretry, as every other reconcile: a mesh that has just formed
	// may not have placed its peers yet (a chaos run's first register was refused "no
	// suitable peers for placement" 1.4 s after formation).
	if err := c.ensureModule(ctx, d); err != nil {
		return api.RegisterReply{}, err
	}
	if _, err := c.reg.Put(ctx, rec, revision); err != nil {
		return api.RegisterReply{}, err
	}
	outbox.Wake(c.sweepNow) // its event goes out from the sweeper, off the reply's path
	if exists {
		if reply.Kept, err = c.topo.retire(ctx, prev.Derivation, d); err != nil {
			c.log.Error("retire topology of previous registration", "module", m.Module, "err", err)
		}
	}
	if rec.Deployment != nil {
		// Its key or its secrets may have changed: the nodes running it are told.
		c.declare(ctx, targets(rec.Deployment, c.reg.Nodes()))
	}
	c.wakeProvisions() // its requirements, or the interfaces its seats provide, may have changed
	c.log.Info("module registered", "module", m.Module, "created", reply.Created, "rotated", reply.Rotated, "key", rec.PublicKey)
	return reply, nil
}

// checkDead refuses module's registration as d when DEAD holds no share for a consumer it
// adds (Budget.CheckDead): the mesh's own consumers (the cascade's, its seats') and every
// registered module's (entries), with module's as d instead of as it was.
func (c *Controller) checkDead(module string, d *manifest.Derivation, entries []*registry.Entry) error {
	nodes := c.reg.Nodes()
	if len(nodes) == 0 {
		nodes = []string{c.node} // a node-scoped seat has a consumer on this node at least
	}
	c.dead.sync(entries, nodes)
	before, after := c.dead.counts(module, d, nodes)
	return c.topo.budget.CheckDead(module, after, before)
}

// checkSeats refuses module's registration as d when the seats' queues would reserve more
// than the store leaves them (Budget.CheckSeats), counting the mesh's own seats and every
// registered module's (entries), with module's as d instead of as it was. A seat's stream
// kept for its backlog after its module went (retire) is not counted: JetStream's own
// reservation refuses what does not fit then, with storeFullError.
func (c *Controller) checkSeats(module string, d *manifest.Derivation, entries []*registry.Entry) error {
	b := c.topo.budget
	others, prev := b.SeatsOf(manifest.Builtin()), int64(0)
	for _, e := range entries {
		if e.Module == module {
			prev = b.SeatsOf(e.Derivation)
			continue
		}
		others += b.SeatsOf(e.Derivation)
	}
	return b.CheckSeats(module, d, others, prev)
}

// mintIdentity asks the vault for a new identity of module, sealed to xkey.
func (c *Controller) mintIdentity(ctx context.Context, module, xkey string) (api.VaultReply, error) {
	if xkey == "" {
		return api.VaultReply{}, errors.New("register: the request carries no xkey to seal the module's seed to; use `meshnode module register`, which sends one")
	}
	var vr api.VaultReply
	b, _ := json.Marshal(api.VaultRequest{XKey: xkey, Owner: module})
	msg, err := c.nc.RequestWithContext(ctx, api.VaultToolSubject(api.VaultVerbIdentity, api.VaultCallerNode), b)
	if err != nil {
		return api.VaultReply{}, fmt.Errorf("register: ask the vault for %s's identity: %w", module, err)
	}
	if err := json.Unmarshal(msg.Data, &vr); err != nil || vr.Error != "" {
		return api.VaultReply{}, fmt.Errorf("register: the vault refused %s's identity: %s%v", module, vr.Error, err)
	}
	return vr, nil
}

// keptPins are the pins of m's previous registration that still hold: m still speaks to the
// seat, and the seat (as m or the registry declares it) still has the version.
func (c *Controller) keptPins(m *manifest.Manifest, pins map[string]string) map[string]string {
	var out map[string]string
	for seat, version := range pins {
		s, ok := m.Seat(seat)
		if !ok {
			s, ok = c.reg.DeclaredSeat(seat)
		}
		if _, has := s.At(version); !ok || !has || !m.SpeaksTo(seat) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[seat] = version
	}
	return out
}

// bindings are the bindings of every other module to the seats m declares.
func (c *Controller) bindings(m *manifest.Manifest) []manifest.Binding {
	var out []manifest.Binding
	for _, s := range m.Seats {
		out = append(out, c.reg.Bindings(s.Name, m.Module)...)
	}
	return out
}

// bind records the protocol of each seat m uses that is declared now (by m itself, another
// module, or the mesh), at the version pins has for it: what m registers against.
func (c *Controller) bind(m *manifest.Manifest, pins map[string]string) map[string]manifest.Protocol {
	out := map[string]manifest.Protocol{}
	for _, seat := range m.Uses {
		s, ok := m.Seat(seat)
		if !ok {
			s, ok = c.reg.DeclaredSeat(seat)
		}
		if !ok {
			continue
		}
		if at, ok := s.At(pins[seat]); ok {
			out[seat] = at.Protocol()
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// pin moves a module to a version of a seat's protocol: it must speak to the seat, the seat
// must declare the version, and the version must emit every event of the seat the module
// consumes by name. The module's record keeps the pin and that version's protocol as its
// binding; its consumer and grant follow (the grant's change kicks its connections, which
// come back speaking the new version).
func (c *Controller) pin(ctx context.Context, req api.PinRequest) (api.PinReply, error) {
	c.lock("pin")
	defer c.mu.Unlock()
	e, ok := c.reg.Get(req.Module)
	if !ok {
		return api.PinReply{}, fmt.Errorf("pin: module %q is not registered; `meshnode module ls` lists those that are", req.Module)
	}
	s, ok := c.reg.DeclaredSeat(req.Seat)
	if !ok {
		return api.PinReply{}, fmt.Errorf("pin: no registered module declares seat %q; register its module first (`meshnode seat ls` lists the seats)", req.Seat)
	}
	version := manifest.NormalVersion(req.Version)
	at, ok := s.At(version)
	if !ok {
		return api.PinReply{}, fmt.Errorf("pin: seat %s has no protocol version %q; it declares %s", req.Seat, req.Version, strings.Join(s.VersionNames(), ", "))
	}
	if !e.Manifest.SpeaksTo(req.Seat) {
		return api.PinReply{}, fmt.Errorf("pin: module %s neither uses seat %s nor consumes its events by name, so it speaks no version of it; add uses: [%s] to its manifest first", req.Module, req.Seat, req.Seat)
	}
	previous := manifest.NormalVersion(e.Pins[req.Seat])
	reply := api.PinReply{Module: e.Module, Seat: req.Seat, Version: version, Previous: previous}
	if previous == version {
		return reply, nil // already there: nothing changes
	}
	for _, b := range c.reg.Bindings(req.Seat, "") {
		if b.Module != e.Module {
			continue
		}
		if missing := slices.DeleteFunc(slices.Clone(b.Events), func(ev string) bool {
			return slices.ContainsFunc(at.Emits, func(em string) bool { return manifest.Matches(ev, em) })
		}); len(missing) > 0 {
			return api.PinReply{}, fmt.Errorf("pin: module %s consumes events %s of seat %s, which %s does not emit (it emits %v); change its consumes first",
				e.Module, strings.Join(missing, ", "), req.Seat, version, at.Emits)
		}
	}

	rec := e.Record
	rec.Pins = maps.Clone(rec.Pins)
	if rec.Pins == nil {
		rec.Pins = map[string]string{}
	}
	rec.Pins[req.Seat] = version
	if version == manifest.V1 {
		delete(rec.Pins, req.Seat)
	}
	if len(rec.Pins) == 0 {
		rec.Pins = nil
	}
	rec.Bound = maps.Clone(rec.Bound)
	if slices.Contains(e.Manifest.Uses, req.Seat) {
		if rec.Bound == nil {
			rec.Bound = map[string]manifest.Protocol{}
		}
		rec.Bound[req.Seat] = at.Protocol()
	}
	d, err := e.Manifest.DeriveWith(rec.Pins)
	if err != nil {
		return api.PinReply{}, err
	}
	if len(rec.Outbox) >= outbox.Max {
		return api.PinReply{}, fmt.Errorf("pin: module %s has %d changes whose events are not recorded yet, and none is stored without its event: is EVENTS full or without a leader (`meshnode status`)?", e.Module, len(rec.Outbox))
	}
	ev, err := outbox.New(registry.EventPinned, c.node, map[string]any{
		"module": e.Module, "seat": req.Seat, "version": version, "previous": previous, "node": c.node})
	if err != nil {
		return api.PinReply{}, err
	}
	rec.Outbox = append(slices.Clone(rec.Outbox), ev)
	rec.Updated = time.Now().UTC()
	// The consumer first (it follows the pinned version's events), then the record, whose
	// grant change kicks the module's connections.
	if err := c.ensureModule(ctx, d); err != nil {
		return api.PinReply{}, err
	}
	if _, err := c.reg.Put(ctx, rec, e.Revision); err != nil {
		return api.PinReply{}, err
	}
	outbox.Wake(c.sweepNow)
	reply.Retirable = !slices.ContainsFunc(c.reg.Bindings(req.Seat, ""), func(b manifest.Binding) bool { return b.Version == previous })
	c.log.Info("module pinned", "module", e.Module, "seat", req.Seat, "version", version, "previous", previous)
	return reply, nil
}

func (c *Controller) handleRemove(ctx context.Context, data []byte) any {
	var req api.RemoveRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return api.RemoveReply{Error: "remove: the request is not JSON: " + err.Error()}
	}
	c.lock("remove")
	defer c.mu.Unlock()
	e, ok := c.reg.Get(req.Module)
	if !ok {
		return api.RemoveReply{Error: fmt.Sprintf("module %q is not registered; `meshnode module ls` lists those that are", req.Module)}
	}
	var users []string
	for _, o := range c.reg.List() {
		for _, s := range e.Manifest.Seats {
			if o.Module != e.Module && slices.Contains(o.Manifest.Uses, s.Name) {
				users = append(users, fmt.Sprintf("%s uses seat %s", o.Module, s.Name))
			}
		}
	}
	if len(users) > 0 && !req.Force {
		return api.RemoveReply{Error: fmt.Sprintf("remove: module %s declares seats other modules are bound to (%s): their work would have no holder and the next declaration could break them; remove or re-register those modules first, or remove with --force (audited)",
			e.Module, strings.Join(users, "; "))}
	}
	// The record stays, marked removed and holding its event, until the event is out: the
	// module is gone from the mirror (and the bus) at once.
	gone := e.Record
	gone.Removed = true
	if len(gone.Outbox) >= outbox.Max {
		return api.RemoveReply{Error: fmt.Sprintf("remove: module %s has %d changes whose events are not recorded yet, and none is stored without its event: is EVENTS full or without a leader (`meshnode status`)?", e.Module, len(gone.Outbox))}
	}
	meta := map[string]any{"module": e.Module, "public_key": e.PublicKey, "node": c.node}
	if len(users) > 0 {
		meta["forced"], meta["bound"] = true, users
	}
	ev, err := outbox.New(registry.EventRemoved, c.node, meta)
	if err != nil {
		return api.RemoveReply{Error: err.Error()}
	}
	gone.Outbox = append(gone.Outbox, ev)
	if _, err := c.reg.Put(ctx, gone, e.Revision); err != nil {
		return api.RemoveReply{Error: err.Error()}
	}
	outbox.Wake(c.sweepNow) // its event goes out from the sweeper, then the record is deleted
	kept, err := c.topo.retire(ctx, e.Derivation, nil)
	if err != nil {
		c.log.Error("retire topology of removed module", "module", e.Module, "err", err)
	}
	if e.Deployment != nil {
		c.declare(ctx, targets(e.Deployment, c.reg.Nodes())) // its nodes stop it
	}
	c.wakeProvisions() // its provisions are removed
	c.log.Info("module removed", "module", e.Module, "seat_users", users)
	return api.RemoveReply{Module: e.Module, Kept: kept}
}

// handleList answers one page of the registered modules, after req.After in name order: as
// many as fit api.ListPageBytes (at least one), so a reply never exceeds the bus's
// payload however many modules there are.
func (c *Controller) handleList(_ context.Context, data []byte) any {
	var req api.ListRequest
	if len(data) > 0 {
		if err := json.Unmarshal(data, &req); err != nil {
			return api.ListReply{Error: "list: the request is not JSON: " + err.Error()}
		}
	}
	reply := api.ListReply{Modules: []api.ModuleInfo{}}
	size := 0
	for _, e := range c.reg.List() {
		if e.Module <= req.After {
			continue
		}
		info := api.ModuleInfo{
			Module: e.Module, PublicKey: e.PublicKey, Seats: []string{},
			Emits: nonNil(e.Manifest.Emits), Consumes: nonNil(e.Manifest.Consumes), Tools: nonNil(e.Manifest.Tools), Uses: nonNil(e.Manifest.Uses),
			Fingerprints: e.Fingerprints, Pins: e.Pins, Deployment: e.Deployment, Registered: e.Registered, Updated: e.Updated,
			Revision: e.Revision, Manifest: e.Record.Manifest,
		}
		for _, s := range e.Manifest.Seats {
			info.Seats = append(info.Seats, s.Name)
		}
		b, _ := json.Marshal(info)
		if len(reply.Modules) > 0 && size+len(b) > api.ListPageBytes {
			reply.Next = reply.Modules[len(reply.Modules)-1].Module
			break
		}
		size += len(b) + 1
		reply.Modules = append(reply.Modules, info)
	}
	if c.quotas != nil {
		names := make([]string, len(reply.Modules))
		for i, m := range reply.Modules {
			names[i] = m.Module
		}
		for i, u := range c.quotas(names) {
			reply.Modules[i].Quota = &u
		}
	}
	return reply
}

// handleWhoami tells a connection which module its key is (registry.Whoami), within the
// node's rate limit per key.
func (c *Controller) handleWhoami(_ context.Context, m *nats.Msg) any {
	key := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:] // the asker: only it may publish here
	// The gate first: the key is proven by the subject, so a flood costs a map lookup, not
	// a parse.
	allowed, tell := c.gate.Allow(key)
	if !allowed && !tell {
		return nil // told within the last second: a flood costs no replies
	}
	reply, answer, why := c.reg.Whoami(key, m.Reply, m.Data, c.node)
	if !answer {
		if why != "" {
			c.log.Debug("whoami: not answered", "key", key, "reply", m.Reply, "why", why)
			c.gate.Refused(key, "whoami", why)
		}
		return nil
	}
	if !allowed {
		return api.WhoamiReply{Error: fmt.Sprintf("too many whoami requests from key %s (more than %.0f a second, the node's rate-limit); slow down and retry", key, c.gate.PerSecond())}
	}
	return reply
}

// nonNil is s, or an empty list for nil: a reply's list prints as [], not null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
