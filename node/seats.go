package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/controller"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/internal/lifecycle"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/seats"
	"github.com/meshnode/meshnode/throttle"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// seatService answers a node's seat tool and turns lease changes into bus authority: the
// holder's connection is kicked so it reconnects with (or without) the holder's permissions,
// and what a dead holder had in hand is NAKed on its behalf, so it is redelivered at once
// rather than after the ack wait (controller.Topology.RedeliverNow).
type seatService struct {
	log   *slog.Logger
	node  string
	key   nkeys.KeyPair
	bus   *embedbus.Bus
	resp  *nats.Conn // answers the seat tool: may publish only to inboxes
	gate  *throttle.Gate
	reg   *registry.Registry
	topo  *controller.Topology
	store *seats.Store
	run   *seats.Runner
	ctrl  *controller.Controller
	vault *vault.Vault
	// git and builder are the cascade's seats' work on this node (build.go).
	git     *build.Git
	builder *build.Builder
	// onControl runs when this node has become the mesh-controller's holder.
	onControl func()

	sub *nats.Subscription

	// versions caches each seat's protocol versions and their bound modules for one registry
	// revision: working them out reads every module for every seat (seat ls, the dashboard
	// each second).
	versionsMu  sync.Mutex
	versionsRev uint64
	versions    map[string][]api.SeatVersionStatus

	nodeMu  sync.Mutex // serialises starting and stopping the mesh's own seats
	grantMu sync.Mutex
	granted map[string]seats.Lease // lease key → the lease whose instance has the holder's grant

	// work runs the hooks' effects in order, off the lease runner's goroutine: granting a
	// seat readies its consumer, which can take seconds while a clustered stream elects a
	// leader, and the runner must keep renewing its leases meanwhile.
	work chan func()

	// leasesStop ends the lease runner; leasesDone is closed when it has released its leases.
	leasesStop context.CancelFunc
	leasesDone chan struct{}

	// work ends at stop: the worker and the releases running after their reply.
	group *lifecycle.Group
}

// do queues f to run after every effect queued before it.
func (s *seatService) do(f func()) {
	select {
	case s.work <- f:
	case <-s.group.Context().Done():
	}
}

func (s *seatService) worker(ctx context.Context) {
	for {
		select {
		case f := <-s.work:
			f()
		case <-ctx.Done():
			return
		}
	}
}

// releaseTimeout bounds a graceful release of a lease.
const releaseTimeout = 5 * time.Second

// consumerReadyTimeout bounds the retries of readying a new holder's consumer.
const consumerReadyTimeout = 30 * time.Second

func (s *seatService) hooks() seats.Hooks {
	return seats.Hooks{
		// The mesh's own seats start and stop at once (subscriptions only), so a node
		// serves them before it reports ready. A module's grant waits in the queue for its
		// consumer; taking authority away never waits: it is in memory, and must be done
		// before the lease is free for another holder.
		Gained: func(l seats.Lease) {
			if l.Module == "" {
				s.nodeSeat(l, true)
				s.event("seat.held", l, "")
				return
			}
			s.do(func() {
				if s.moduleGained(l) {
					s.event("seat.held", l, "")
				}
			})
		},
		Released: func(l seats.Lease) {
			s.lostAuthority(l)
			s.event("seat.released", l, "")
		},
		Lost: func(l seats.Lease, err error) {
			s.lostAuthority(l)
			s.event("seat.lost", l, err.Error())
		},
	}
}

// nodeSeat starts or stops what the node does as holder of one of the mesh's own seats.
func (s *seatService) nodeSeat(l seats.Lease, held bool) {
	// Serialised, and agreeing with the runner's record: a start only while it holds this lease
	// (a loss reported after its gain wins), a stop not while it holds the seat again at another
	// epoch (an older lease's end, reported by its renewal after the new lease's start).
	s.nodeMu.Lock()
	defer s.nodeMu.Unlock()
	h, ok := s.run.Holds(seats.Candidate{Seat: l.Seat, Scope: l.Scope, Module: l.Module, Instance: l.Instance})
	if ok && h.Epoch != l.Epoch || held && !ok {
		return
	}
	var start func() error
	var stop func()
	switch l.Seat {
	case manifest.ControllerSeat:
		start = func() error {
			return s.ctrl.Start(controller.Seat{List: s.status, Epoch: func() uint64 { return s.heldEpoch(manifest.ControllerSeat) }})
		}
		stop = s.ctrl.Stop
		if held && s.onControl != nil {
			defer s.onControl()
		}
	case manifest.VaultSeat:
		if s.vault == nil {
			return
		}
		start, stop = s.vault.Start, s.vault.Stop
	case build.GitSeat:
		start, stop = s.git.Start, s.git.Stop
	case build.BuilderSeat:
		start, stop = s.builder.Start, s.builder.Stop
	default:
		return
	}
	if !held {
		stop()
		return
	}
	if err := start(); err != nil && !errors.Is(err, vault.ErrClosed) { // won while the node closes
		s.log.Error("serve seat", "seat", l.Seat, "err", err)
	}
}

// moduleGained readies the seat's consumer for the new holder and grants it the holder's
// permissions; false if the lease was lost meanwhile.
func (s *seatService) moduleGained(l seats.Lease) bool {
	e, ok := s.reg.Get(l.Module)
	if !ok {
		return false
	}
	if c, ok, err := e.Derivation.SeatConsumer(l.Seat, l.Node); err == nil && ok {
		// Retried: while a clustered stream has no leader the request goes unanswered.
		ctx, cancel := context.WithTimeout(s.group.Context(), consumerReadyTimeout)
		err := jsretry.Request(ctx, func(ctx context.Context) error { return s.topo.RedeliverNow(ctx, c) })
		cancel()
		if err != nil {
			s.log.Warn("ready the seat's consumer; the holder waits for it", "seat", l.Seat, "err", err)
		}
	}
	// The grant is this node's own record, not the lease bucket's mirror (which can lag by
	// seconds while a clustered stream moves): the instance's next connection, here, has the
	// holder's permissions, and it is told it holds the seat only from then on. Granted only
	// while the lease is still held, under the lock its loss takes too.
	s.grantMu.Lock()
	held, ok := s.run.Holds(seats.Candidate{Seat: l.Seat, Scope: l.Scope, Module: l.Module, Instance: l.Instance})
	if ok && held.Epoch == l.Epoch {
		s.setGrant(l, true)
	}
	s.grantMu.Unlock()
	if !ok || held.Epoch != l.Epoch {
		return false
	}
	s.bus.KickInstance(e.PublicKey, l.Instance)
	return true
}

// setGrant records or removes l's grant; the caller holds grantMu.
func (s *seatService) setGrant(l seats.Lease, on bool) {
	if s.granted == nil {
		s.granted = map[string]seats.Lease{}
	}
	key := seats.Key(l.Seat, l.Scope, l.Node)
	switch {
	case on:
		s.granted[key] = l
	case s.granted[key].Instance == l.Instance && s.granted[key].Epoch == l.Epoch: // not a newer lease's
		delete(s.granted, key)
	}
}

func (s *seatService) isGranted(key, instance string) bool {
	s.grantMu.Lock()
	defer s.grantMu.Unlock()
	g, ok := s.granted[key]
	return ok && g.Instance == instance
}

// grants returns the leases whose holder's permissions module's instance has on this node.
func (s *seatService) grants(module, instance string) []seats.Lease {
	s.grantMu.Lock()
	defer s.grantMu.Unlock()
	var out []seats.Lease
	for _, l := range s.granted {
		if l.Module == module && l.Instance == instance {
			out = append(out, l)
		}
	}
	return out
}

// holders returns the leases of seat this node has granted: the instances holding it here.
func (s *seatService) holders(seat string) []seats.Lease {
	s.grantMu.Lock()
	defer s.grantMu.Unlock()
	var out []seats.Lease
	for _, l := range s.granted {
		if l.Seat == seat {
			out = append(out, l)
		}
	}
	return out
}

// heldEpoch is the epoch of this node's lease of a mesh-scoped seat, 0 when it holds none:
// the runner's own record of the lease it holds, since the lease bucket's mirror can lag.
func (s *seatService) heldEpoch(seat string) uint64 {
	l, _ := s.run.Holds(seats.Candidate{Seat: seat, Scope: manifest.ScopeMesh, Instance: s.node})
	return l.Epoch
}

// lostAuthority takes a released or lost seat's authority from its holder at once.
func (s *seatService) lostAuthority(l seats.Lease) {
	if l.Module == "" {
		s.nodeSeat(l, false)
		return
	}
	s.grantMu.Lock()
	s.setGrant(l, false)
	s.grantMu.Unlock()
	if e, ok := s.reg.Get(l.Module); ok {
		s.bus.KickInstance(e.PublicKey, l.Instance)
	}
}

// event publishes one of the node's own seat events, with metadata only.
func (s *seatService) event(name string, l seats.Lease, reason string) {
	publishNodeEvent(s.bus.Conn(), s.key, s.node, name, map[string]any{
		"seat": l.Seat, "scope": l.Scope, "module": l.Module, "instance": l.Instance,
		"node": l.Node, "epoch": l.Epoch, "reason": reason,
	}, s.log)
}

// publishNodeEvent publishes one of the node's own events (outbox.NodeEvent). Fire and
// forget: a node event must not hold up what it reports on.
func publishNodeEvent(nc *nats.Conn, key nkeys.KeyPair, node, name string, meta map[string]any, log *slog.Logger, msgID ...string) {
	m, err := outbox.NodeEvent(key, node, name, meta, msgID...)
	if err == nil {
		err = nc.PublishMsg(m)
	}
	if err != nil {
		log.Warn("publish node event", "event", name, "err", err)
	}
}

// storeNodeEvent stores one of the node's own events in EVENTS, acked and asked again while
// EVENTS elects a leader (its id keeps one copy): a server's end is not lost with the
// leader of the stream that records it.
func (n *Node) storeNodeEvent(ctx context.Context, name string, meta map[string]any) error {
	m, err := outbox.NodeEvent(n.key, n.id.Name, name, meta)
	if err == nil {
		err = jsretry.Publish(ctx, n.bus.JetStream(), m)
	}
	if err != nil {
		n.log.Warn("store node event", "event", name, "err", err)
	}
	return err
}

// start subscribes to this node's seat tool.
func (s *seatService) start() error {
	s.group = lifecycle.NewGroup(context.Background())
	s.work = make(chan func(), 256)
	s.group.Go(s.worker)
	sub, err := s.resp.Subscribe(SeatToolSubject(s.node, "*"), func(m *nats.Msg) {
		module := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		if !manifest.InInbox(m.Reply, manifest.InboxPrefix(module)) {
			s.log.Debug("seat tool: a reply outside the module's inbox is not answered", "module", module, "reply", m.Reply)
			s.gate.Refused(module, "seat", "reply subject outside the module's inbox")
			return
		}
		if ok, tell := s.gate.Allow(module); !ok {
			if tell { // once a second; the others are dropped, so a flood costs no replies
				b, _ := json.Marshal(api.SeatReply{Error: fmt.Sprintf("too many seat requests from module %s (more than %.0f a second, the node's rate-limit); slow down and retry", module, s.gate.PerSecond())})
				m.Respond(b)
			}
			return
		}
		b, _ := json.Marshal(s.handle(module, m.Data))
		m.Respond(b)
	})
	if err != nil {
		return fmt.Errorf("subscribe seat tool: %w", err)
	}
	s.sub = sub
	return nil
}

// runLeases runs the lease runner until stop.
func (s *seatService) runLeases() {
	ctx, cancel := context.WithCancel(context.Background())
	s.leasesStop, s.leasesDone = cancel, make(chan struct{})
	go func() {
		defer close(s.leasesDone)
		s.run.Run(ctx)
	}()
}

func (s *seatService) stop() {
	if s.leasesStop != nil {
		s.leasesStop()
		<-s.leasesDone
	}
	if s.sub != nil {
		s.sub.Unsubscribe()
	}
	if s.group != nil {
		s.group.Close()
	}
	if s.git != nil {
		s.git.Close()
	}
	if s.builder != nil {
		s.builder.Close()
	}
}

func (s *seatService) handle(module string, data []byte) api.SeatReply {
	var req api.SeatRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return api.SeatReply{Error: "seat: the request is not JSON"}
	}
	reply := api.SeatReply{Seat: req.Seat}
	e, ok := s.reg.Get(module)
	if !ok {
		reply.Error = fmt.Sprintf("module %s is not registered", module)
		return reply
	}
	seat, ok := e.Manifest.Seat(req.Seat)
	if !ok {
		reply.Error = fmt.Sprintf("module %s declares no seat %q", module, req.Seat)
		return reply
	}
	c := seats.Candidate{Seat: seat.Name, Scope: seat.Scope, Module: module, Instance: req.Instance}
	switch req.Action {
	case "candidate":
		if !s.bus.Connected(e.PublicKey, req.Instance) {
			reply.Error = fmt.Sprintf("no connection of %s named %q on node %s: an instance asks for itself", module, req.Instance, s.node)
			return reply
		}
		s.run.Add(c)
	case "release":
		// Released after the reply: releasing kicks the asking connection.
		s.group.Go(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
			defer cancel()
			s.run.Remove(ctx, c)
		})
		return reply
	default:
		reply.Error = fmt.Sprintf("unknown seat action %q: candidate or release", req.Action)
		return reply
	}
	if l, ok := s.run.Holds(c); ok && s.isGranted(seats.Key(c.Seat, c.Scope, s.node), c.Instance) {
		reply.Holder, reply.Epoch = true, l.Epoch
		if cons, ok, err := e.Derivation.SeatConsumer(seat.Name, s.node); err == nil && ok {
			reply.Stream, reply.Consumer = cons.Stream, cons.Name
		}
	}
	return reply
}

// alive reports whether a candidate's connection is still open on this node; the node is
// always alive for its own seats.
func (s *seatService) alive(c seats.Candidate) bool {
	if c.Module == "" {
		return true
	}
	e, ok := s.reg.Get(c.Module)
	return ok && s.bus.Connected(e.PublicKey, c.Instance)
}

// versionStatus is each version of seat's protocol with the modules bound to it; one nobody
// is bound to is retirable.
func versionStatus(seat manifest.Seat, bindings []manifest.Binding) []api.SeatVersionStatus {
	var out []api.SeatVersionStatus
	for _, v := range seat.VersionNames() {
		vs := api.SeatVersionStatus{Version: v, Bound: []string{}}
		for _, b := range bindings {
			if manifest.NormalVersion(b.Version) == v {
				vs.Bound = append(vs.Bound, b.Module)
			}
		}
		vs.Retirable = len(vs.Bound) == 0
		out = append(out, vs)
	}
	return out
}

// status lists every seat: the mesh's own and every registered module's, with holders and
// backlogs.
func (s *seatService) status(ctx context.Context) []api.SeatStatus {
	return s.statusWith(func(stream string) (uint64, bool) {
		st, err := s.bus.JetStream().Stream(ctx, stream)
		if err != nil {
			return 0, false
		}
		return st.CachedInfo().State.Msgs, true
	})
}

// versionsOf is versionStatus of seat's bindings, worked out once per registry revision.
func (s *seatService) versionsOf(seat manifest.Seat) []api.SeatVersionStatus {
	rev := s.reg.Revision()
	s.versionsMu.Lock()
	defer s.versionsMu.Unlock()
	if s.versions == nil || s.versionsRev != rev {
		s.versions, s.versionsRev = map[string][]api.SeatVersionStatus{}, rev
	}
	v, ok := s.versions[seat.Name]
	if !ok {
		v = versionStatus(seat, s.reg.Bindings(seat.Name, ""))
		s.versions[seat.Name] = v
	}
	return v
}

// statusWith is status with each seat's backlog read by backlog (the dashboard reads the
// streams in-process).
func (s *seatService) statusWith(backlog func(stream string) (uint64, bool)) []api.SeatStatus {
	var out []api.SeatStatus
	add := func(st api.SeatStatus, key string) {
		if l, ok := s.store.Get(key); ok {
			since := l.Since
			st.Holder, st.HolderAt, st.Epoch, st.Since = l.Instance, l.Node, l.Epoch, &since
			if l.Module != "" {
				st.Holder = l.Module + "/" + l.Instance
			}
		}
		out = append(out, st)
	}
	add(api.SeatStatus{Seat: manifest.ControllerSeat, Scope: manifest.ScopeMesh}, manifest.ControllerSeat)
	add(api.SeatStatus{Seat: manifest.VaultSeat, Scope: manifest.ScopeMesh}, manifest.VaultSeat)
	for _, seat := range []string{build.GitSeat, build.BuilderSeat} {
		if _, declared := s.reg.Declarer(seat); !declared {
			add(api.SeatStatus{Seat: seat, Scope: manifest.ScopeMesh}, seat)
		}
	}
	users := map[string][]string{}
	entries := s.reg.List()
	for _, e := range entries {
		for _, u := range e.Manifest.Uses {
			users[u] = append(users[u], e.Module)
		}
	}
	for _, e := range entries {
		for _, seat := range e.Manifest.Seats {
			st := api.SeatStatus{Seat: seat.Name, Scope: seat.Scope, Module: e.Module, Users: users[seat.Name],
				Versions: s.versionsOf(seat)}
			if n, ok := backlog(manifest.SeatStreamName(seat.Name)); ok {
				st.Backlog = n
			}
			if seat.Scope == manifest.ScopeNode {
				st.Node = s.node
			}
			add(st, seats.Key(seat.Name, seat.Scope, s.node))
		}
	}
	return out
}
