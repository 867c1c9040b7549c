package seats

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/meshnode/meshnode/manifest"
)

// staleRetry is how often the Runner asks the bucket about a lease its mirror shows
// unrenewed.
const staleRetry = 500 * time.Millisecond

// expiryTick is how often the Runner checks its leases against their TTL.
const expiryTick = 50 * time.Millisecond

// aliveInterval is how often the Runner checks that its candidates' connections are still
// there.
const aliveInterval = 200 * time.Millisecond

// deadAfter is how long a candidate's connection may be missing before the candidate is
// dropped and its lease released: longer than a reconnect (the node kicks a holder's
// connection whenever its authority changes, and it comes straight back), short enough that
// a dead holder's seat is free within about a second.
const deadAfter = time.Second

// Candidate is one connection that asked to hold a seat on this node.
type Candidate struct {
	Seat     string
	Scope    manifest.Scope
	Module   string // "" for the node itself
	Instance string
}

// Hooks is what the node does when a lease changes hands on it. Gained runs on the Runner's
// goroutine, Lost on it or on its expiry clock, Released on whichever goroutine released
// (Run's, Remove's or Retire's caller): the hooks must be safe to call concurrently, and
// Released and Lost must be quick — they take the holder's authority away.
type Hooks struct {
	// Gained: this node's candidate now holds the lease.
	Gained func(l Lease)
	// Released: the holder lets go (it stopped, or its connection is gone); the lease is
	// freed in the bucket after the hook returns.
	Released func(l Lease)
	// Lost: the lease expired or was taken while this node thought it held it.
	Lost func(l Lease, err error)
}

// Runner runs the leases of this node's candidates.
type Runner struct {
	store *Store
	node  string
	log   *slog.Logger
	hooks Hooks
	// Alive reports whether a candidate's connection is still there.
	alive func(Candidate) bool

	wake chan string

	mu         sync.Mutex
	retired    bool                    // the node is leaving: it takes no seat any more
	candidates []Candidate             // in arrival order: the first eligible one is next
	seen       map[Candidate]time.Time // when each candidate's connection was last seen
	held       map[string]*held        // by key
	staleTried map[string]time.Time    // by key: when a lease the mirror shows unrenewed was last tried

	renewals sync.WaitGroup // renewals on the wire
}

type held struct {
	lease Lease
	rev   uint64
	// sent is when the last successful write of the lease (acquire or renew) was sent: the
	// bucket expires the lease TTL after it reached the server, so no later than sent+TTL
	// may another node take it. The holder gives it up before that.
	sent time.Time
	// renewing: a renewal is on the wire; the next tick does not send another.
	renewing bool
}

// ErrExpired means a lease could not be renewed within its TTL: this node is cut off from
// the mesh's quorum, and another node may take the seat.
var ErrExpired = errors.New("lease not renewed within its TTL (no quorum here): another node may take the seat")

// expiryMargin is how long before sent+TTL a holder gives its lease up.
func (r *Runner) expiryMargin() time.Duration { return r.store.TTL() / 6 }

// NewRunner returns a Runner for node. alive reports whether a candidate is still connected.
func NewRunner(store *Store, node string, log *slog.Logger, alive func(Candidate) bool, hooks Hooks) *Runner {
	r := &Runner{store: store, node: node, log: log, hooks: hooks, alive: alive,
		wake: make(chan string, 64), held: map[string]*held{}, seen: map[Candidate]time.Time{}, staleTried: map[string]time.Time{}}
	store.Subscribe(r.wake)
	return r
}

// Add makes c a candidate (again); it is a no-op for a known candidate.
func (r *Runner) Add(c Candidate) {
	r.mu.Lock()
	if r.retired {
		r.mu.Unlock()
		return
	}
	if !slices.Contains(r.candidates, c) {
		r.candidates = append(r.candidates, c)
	}
	r.seen[c] = time.Now()
	r.mu.Unlock()
	r.poke()
}

// Holds reports the lease c holds through this Runner, if any.
func (r *Runner) Holds(c Candidate) (Lease, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.held[Key(c.Seat, c.Scope, r.node)]
	if ok && h.lease.Module == c.Module && h.lease.Instance == c.Instance {
		return h.lease, true
	}
	return Lease{}, false
}

// Remove withdraws c and releases its lease at once if it holds one, so the next candidate
// takes over without waiting for the TTL: a graceful handoff.
func (r *Runner) Remove(ctx context.Context, c Candidate) {
	r.mu.Lock()
	r.candidates = slices.DeleteFunc(r.candidates, func(x Candidate) bool { return x == c })
	delete(r.seen, c)
	key := Key(c.Seat, c.Scope, r.node)
	h, ok := r.held[key]
	if ok && (h.lease.Module != c.Module || h.lease.Instance != c.Instance) {
		ok = false
	}
	var snapshot held
	if ok {
		delete(r.held, key)
		snapshot = *h // renewAll updates rev under r.mu
	}
	r.mu.Unlock()
	if ok {
		r.releaseHeld(ctx, &snapshot)
	}
	r.poke()
}

func (r *Runner) poke() {
	select {
	case r.wake <- "":
	default:
	}
}

// Run keeps leases until ctx ends, then releases every lease it holds.
func (r *Runner) Run(ctx context.Context) error {
	renew := time.NewTicker(r.store.TTL() / 3)
	defer renew.Stop()
	alive := time.NewTicker(aliveInterval)
	defer alive.Stop()
	// Expiry runs on its own clock: the loop below can block on the bus for seconds exactly
	// when leases are at risk (no quorum), and a holder must never outlive its lease.
	expiring := make(chan struct{})
	defer func() { <-expiring }()
	defer r.renewals.Wait()
	go func() {
		defer close(expiring)
		t := time.NewTicker(expiryTick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				r.expire()
			}
		}
	}()
	r.acquireFree(ctx)
	for {
		select {
		case <-ctx.Done():
			// A renewal answered as the node stops updates its lease's revision first: freed
			// at the one before, the lease would stay for its TTL, or be freed at the new one
			// by the renewal itself before its holder's authority was taken away.
			r.renewals.Wait()
			r.releaseAll()
			return nil
		case <-renew.C:
			r.renewAll(ctx)
			r.acquireFree(ctx)
		case <-alive.C:
			r.dropDead(ctx)
			r.acquireFree(ctx)
		case <-r.wake:
			r.acquireFree(ctx)
		}
	}
}

// Acquire tries once, now, to take every free seat that has a live candidate here: a node
// takes its own seats before it reports ready. Call it before Run.
func (r *Runner) Acquire(ctx context.Context) { r.acquireFree(ctx) }

// acquireFree tries to take every free seat that has a live candidate here.
func (r *Runner) acquireFree(ctx context.Context) {
	r.mu.Lock()
	if r.retired {
		r.mu.Unlock()
		return
	}
	cands := slices.Clone(r.candidates)
	r.mu.Unlock()
	tried := map[string]bool{}
	for _, c := range cands {
		key := Key(c.Seat, c.Scope, r.node)
		if tried[key] {
			continue
		}
		r.mu.Lock()
		_, mine := r.held[key]
		r.mu.Unlock()
		if mine {
			continue
		}
		if !r.free(ctx, key) {
			continue
		}
		if !r.alive(c) {
			continue
		}
		tried[key] = true
		l := Lease{Seat: c.Seat, Scope: c.Scope, Node: r.node, Module: c.Module, Instance: c.Instance, Since: time.Now().UTC()}
		// No longer than the lease could be kept: an acquire answered later is expired at once.
		actx, cancel := context.WithTimeout(ctx, r.store.TTL()-r.expiryMargin())
		sent := time.Now()
		rev, err := r.store.acquire(actx, l)
		cancel()
		if errors.Is(err, ErrHeld) {
			continue
		}
		if err != nil {
			r.log.Warn("acquire lease", "seat", c.Seat, "err", err)
			continue
		}
		l.Epoch = rev
		r.mu.Lock()
		if r.retired {
			// The node began to leave while this acquire was on the wire: give it back.
			r.mu.Unlock()
			r.release(ctx, &held{lease: l, rev: rev})
			return
		}
		r.held[key] = &held{lease: l, rev: rev, sent: sent}
		r.mu.Unlock()
		r.log.Info("seat held", "seat", c.Seat, "module", c.Module, "instance", c.Instance, "epoch", rev)
		if r.hooks.Gained != nil {
			r.hooks.Gained(l)
		}
	}
}

// drop forgets h if it is still the lease held at key; false if another path dropped it.
func (r *Runner) drop(key string, h *held) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held[key] != h {
		return false
	}
	delete(r.held, key)
	return true
}

// free reports whether the lease of key may be free for this node to try: the mirror shows
// none; or shows one in another node's name unrenewed for a TTL (expired, or the mirror is
// behind: the bucket refuses the acquire if it is still held); or one in this node's name
// that this Runner does not hold — a leftover of a crash, taken over rather than waited out.
func (r *Runner) free(ctx context.Context, key string) bool {
	l, ok := r.store.Get(key)
	switch {
	case !ok:
		return true
	case r.isMine(l):
		return false // held by a live candidate here: renewed by us
	case l.Node != r.node:
		if !r.store.Stale(key) {
			return false
		}
		// Ask the bucket at most every staleRetry: it may well still be held.
		r.mu.Lock()
		defer r.mu.Unlock()
		if time.Since(r.staleTried[key]) < staleRetry {
			return false
		}
		r.staleTried[key] = time.Now()
		return true
	}
	if err := r.store.takeOver(ctx, key); err != nil {
		r.log.Warn("take over stale lease", "key", key, "err", err)
		return false
	}
	return true
}

func (r *Runner) isMine(l Lease) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.held[Key(l.Seat, l.Scope, r.node)]
	return ok && h.lease.Instance == l.Instance
}

// renewAll renews every held lease; a lease that changed under us is lost.
func (r *Runner) renewAll(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Each lease is renewed on its own, and may take until just before it would expire: on
	// a loaded machine a replicated write can take more than a renewal period, and giving up
	// early would lose seats that are not at risk. The loop does not wait for them.
	for _, h := range r.held {
		if h.renewing {
			continue
		}
		h.renewing = true
		r.renewals.Add(1)
		go func() {
			defer r.renewals.Done()
			r.renew(ctx, h)
		}()
	}
}

func (r *Runner) renew(ctx context.Context, h *held) {
	r.mu.Lock()
	lease, prev, deadline := h.lease, h.rev, h.sent.Add(r.store.TTL()-r.expiryMargin())
	r.mu.Unlock()
	rctx, cancel := context.WithDeadline(ctx, deadline)
	sent := time.Now()
	rev, err := r.store.renew(rctx, lease, prev)
	cancel()
	key := Key(lease.Seat, lease.Scope, r.node)
	r.mu.Lock()
	h.renewing = false
	current := r.held[key] == h
	if err == nil && current {
		h.rev, h.sent = rev, sent
	}
	r.mu.Unlock()
	switch {
	case err == nil && !current:
		// Dropped (released, retired or expired) while the renewal was on the wire, which
		// gave the lease a fresh TTL: free it at its new revision, or the seat stays locked.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.store.TTL())
		defer cancel()
		if err := r.store.release(rctx, lease, rev); err != nil {
			r.log.Warn("release a lease renewed after it was given up; it expires with its TTL", "seat", lease.Seat, "err", err)
		}
	case err == nil:
	case errors.Is(err, ErrLost):
		if !r.drop(key, h) {
			return // expired meanwhile: already reported
		}
		r.log.Warn("seat lost", "seat", lease.Seat, "instance", lease.Instance, "err", err)
		if r.hooks.Lost != nil {
			r.hooks.Lost(lease, err)
		}
	default:
		// The bus is slow or away; the next tick tries again, and expiry gives the lease up
		// before it can run out.
		r.log.Warn("renew lease", "seat", lease.Seat, "err", err)
	}
}

// expire gives up every lease whose last successful write is about to run out: the node
// cannot reach the bucket's quorum, and the majority will soon hand the seat to another node.
// A holder must never outlive its lease, or two would hold the seat at once.
func (r *Runner) expire() {
	r.mu.Lock()
	var lost []Lease
	for key, h := range r.held {
		if time.Since(h.sent) >= r.store.TTL()-r.expiryMargin() {
			lost = append(lost, h.lease)
			delete(r.held, key)
		}
	}
	r.mu.Unlock()
	for _, l := range lost {
		r.log.Warn("seat lost", "seat", l.Seat, "instance", l.Instance, "err", ErrExpired)
		if r.hooks.Lost != nil {
			r.hooks.Lost(l, ErrExpired)
		}
	}
}

// dropDead forgets candidates whose connection has been gone for deadAfter, releasing their
// leases.
func (r *Runner) dropDead(ctx context.Context) {
	r.mu.Lock()
	cands := slices.Clone(r.candidates)
	r.mu.Unlock()
	now := time.Now()
	for _, c := range cands {
		if r.alive(c) {
			r.mu.Lock()
			r.seen[c] = now
			r.mu.Unlock()
			continue
		}
		r.mu.Lock()
		last := r.seen[c]
		r.mu.Unlock()
		if now.Sub(last) >= deadAfter {
			r.Remove(ctx, c)
		}
	}
}

// releaseHeld takes the holder's authority away, then frees the lease for the next
// candidate: never the other way round, or two could hold the seat for a moment.
func (r *Runner) releaseHeld(ctx context.Context, h *held) {
	if r.hooks.Released != nil {
		r.hooks.Released(h.lease)
	}
	r.release(ctx, h)
}

func (r *Runner) release(ctx context.Context, h *held) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.store.TTL())
	defer cancel()
	if err := r.store.release(rctx, h.lease, h.rev); err != nil {
		r.log.Warn("release lease; it expires with its TTL", "seat", h.lease.Seat, "err", err)
	}
	r.log.Info("seat released", "seat", h.lease.Seat, "instance", h.lease.Instance)
}

// Retire releases every lease held here, running the Released hooks, and takes no seat from
// then on: the node is leaving the mesh, and hands its seats on first.
func (r *Runner) Retire(ctx context.Context) {
	hs := r.takeAll(true)
	for i := range hs {
		r.releaseHeld(ctx, &hs[i])
	}
}

// takeAll forgets every lease held here and returns them; retire also ends candidacy.
func (r *Runner) takeAll(retire bool) []held {
	r.mu.Lock()
	defer r.mu.Unlock()
	if retire {
		r.retired = true
		r.candidates = nil
	}
	hs := make([]held, 0, len(r.held))
	for k, h := range r.held {
		hs = append(hs, *h)
		delete(r.held, k)
	}
	return hs
}

// releaseAll releases every lease held here, so other nodes' candidates take over at once:
// the node is stopping. Each holder's authority is taken away first (Released), as for any
// release: the node's bus stays open for a while after its leases are freed, and a holder
// left consuming there would be a second holder beside the next one.
func (r *Runner) releaseAll() {
	hs := r.takeAll(false)
	if r.hooks.Released != nil {
		for _, h := range hs {
			r.hooks.Released(h.lease)
		}
	}
	// At once, not one after another: without a quorum each waits out its bound (the TTL),
	// and a stopping node must not wait that many times over (its leases expire anyway).
	var wg sync.WaitGroup
	for i := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.release(context.Background(), &hs[i])
		}()
	}
	wg.Wait()
}
