package seats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/mirror"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the KV bucket of seat leases.
const Bucket = "mesh-seats"

// DefaultTTL is how long a lease lives without renewal. Three seconds bounds failover when a
// node dies (TTL + the time to notice) while tolerating two missed renewals, which are sent
// every TTL/3: a GC pause or a slow disk write does not cost the seat.
const DefaultTTL = 3 * time.Second

// Errors of leases.
var (
	// ErrHeld means another holder has the lease.
	ErrHeld = errors.New("seat is held")
	// ErrLost means a lease changed under its holder: it expired or was taken.
	ErrLost = errors.New("lease lost")
)

// Lease is one seat's holder, as stored in mesh-seats.
type Lease struct {
	// Seat is the seat's name.
	Seat string `json:"seat"`
	// Scope is the seat's scope.
	Scope manifest.Scope `json:"scope"`
	// Node is the node that runs the lease: the holder is connected to it.
	Node string `json:"node"`
	// Module is the holding module; "" when the node itself holds a mesh seat.
	Module string `json:"module,omitempty"`
	// Instance names the holding connection (a module instance, or the node).
	Instance string `json:"instance"`
	// Since is when the lease was acquired.
	Since time.Time `json:"since"`
	// Epoch is the revision at which the lease was created: the fencing token. Zero in the
	// value until the first renewal; read it through a mirror, which fills it in.
	Epoch uint64 `json:"epoch,omitempty"`
}

// Key is the lease's key: the seat for mesh scope, seat.node for node scope.
func Key(seat string, scope manifest.Scope, node string) string {
	if scope == manifest.ScopeNode {
		return seat + "." + node
	}
	return seat
}

// mirrored is one lease as the mirror last saw it: at which revision, and when.
type mirrored struct {
	lease Lease
	rev   uint64
	seen  time.Time
}

// Store is the bucket of leases and a mirror of it.
type Store struct {
	kv    jetstream.KeyValue
	js    jetstream.JetStream
	ttl   time.Duration
	watch *mirror.Watch

	mu     sync.RWMutex
	leases map[string]mirrored // by key
	notify []chan<- string     // told the key of every change
	// lastHeld is the last lease seen of each seat a node holds itself (no module): kept
	// after it is released or expires, and across a rewatch, for LastHeld.
	lastHeld map[string]Lease
	// heldAt is the node-held leases the mirror saw of each key, by epoch: the last
	// heldHistory of them, for HeldAt.
	heldAt map[string][]heldLease

	log     atomic.Pointer[slog.Logger] // nil: slog.Default()
	repairs sync.WaitGroup              // deletes of refused records, waited for by Close
	closed  bool                        // under mu: Close has begun, no repair starts

	holderHook atomic.Pointer[func(before, after *Lease)]
}

// OnHolderChange sets f to be told, on the watch's goroutine, each change of a seat's holder
// the watch sees: the lease before (nil: the seat was free) and after (nil: it is free now).
// A renewal by the same holder is no change.
func (s *Store) OnHolderChange(f func(before, after *Lease)) { s.holderHook.Store(&f) }

// SetLogger sets the logger the store reports refused lease records to (default:
// slog.Default()).
func (s *Store) SetLogger(log *slog.Logger) { s.log.Store(log) }

func (s *Store) logger() *slog.Logger {
	if l := s.log.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// OpenStore creates or updates the bucket and loads the mirror. Watch must then run.
// maxBytes bounds the bucket (reserved with JetStream, so a full store cannot refuse a
// renewal); zero: no bound.
func OpenStore(ctx context.Context, js jetstream.JetStream, replicas int, ttl time.Duration, maxBytes int64) (*Store, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	kv, err := EnsureBucket(ctx, js, replicas, ttl, maxBytes)
	if err != nil {
		return nil, err
	}
	s := &Store{kv: kv, js: js, ttl: ttl, leases: map[string]mirrored{}, lastHeld: map[string]Lease{}, heldAt: map[string][]heldLease{}}
	if s.watch, err = mirror.Open(ctx, kv, s.apply); err != nil {
		return nil, fmt.Errorf("load %s: %w", Bucket, err)
	}
	return s, nil
}

// EnsureBucket creates or updates the leases' bucket, and only that: how a node makes it
// again after it was deleted, while its Store's watch (an ordered consumer, which follows
// the bucket back) stays as it is.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, replicas int, ttl time.Duration, maxBytes int64) (jetstream.KeyValue, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	kv, err := ensure.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:         Bucket,
		Description:    "meshnode: seat leases (one holder per scope)",
		History:        1,
		Replicas:       replicas,
		Storage:        jetstream.FileStorage,
		LimitMarkerTTL: ttl,
		MaxBytes:       maxBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", Bucket, err)
	}
	return kv, nil
}

// TTL is the leases' time to live.
func (s *Store) TTL() time.Duration { return s.ttl }

// Watch follows the bucket until ctx ends.
// A watch that ends while the bucket is gone (nats.go gives it up when it cannot rebuild its
// consumer) is taken up again once the bucket is back, trying again after a growing wait.
func (s *Store) Watch(ctx context.Context) error {
	for {
		err := s.watch.Run(ctx)
		if ctx.Err() != nil {
			return err
		}
		s.logger().Warn("the leases' watch ended; watching again once the bucket answers", "bucket", Bucket)
		wait := backoff.Backoff{First: 500 * time.Millisecond, Max: 5 * time.Second}
		for {
			if wait.Wait(ctx) != nil {
				return nil
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := s.watch.Retake(rctx, s.clear)
			cancel()
			if err == nil {
				break
			}
			s.logger().Debug("the leases' bucket does not answer yet", "err", err)
		}
	}
}

// Rewatch follows the bucket afresh after it was deleted and made again (mirror.Watch's
// Rewatch): the mirror is emptied and loaded from the new bucket.
func (s *Store) Rewatch(ctx context.Context) error {
	if err := s.watch.Rewatch(ctx, s.clear); err != nil {
		return fmt.Errorf("load %s: %w", Bucket, err)
	}
	return nil
}

// clear empties the mirror, before a new watch loads the bucket again.
func (s *Store) clear() {
	s.mu.Lock()
	clear(s.leases)
	s.mu.Unlock()
}

// Close stops the watch and waits for the deletes of refused records.
func (s *Store) Close() error {
	err := s.watch.Close()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.repairs.Wait()
	return err
}

// Subscribe registers ch to receive the key of every change the mirror sees. Sends never
// block: a full channel misses a wake-up, which the receiver's timer makes up for.
func (s *Store) Subscribe(ch chan<- string) {
	s.mu.Lock()
	s.notify = append(s.notify, ch)
	s.mu.Unlock()
}

func (s *Store) apply(e jetstream.KeyValueEntry) {
	var l Lease
	var bad error
	if e.Operation() == jetstream.KeyValuePut {
		l, bad = decodeLease(e.Key(), e.Value())
	}
	if bad != nil {
		// Anything may sit in the bucket: a value that is no lease holds no seat, yet its key
		// would refuse every acquire for ever. It is deleted at its revision (a lease
		// written since is left alone); the delete frees the seat for the candidates.
		s.logger().Error("seat lease refused: deleted", "key", e.Key(), "revision", e.Revision(), "err", bad)
		s.mu.Lock()
		if !s.closed { // Close waits for the repairs it let start, and no more start after it
			s.repairs.Add(1)
			go s.deleteBad(e.Key(), e.Revision())
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	var before, after *Lease
	if old, ok := s.leases[e.Key()]; ok {
		before = &old.lease
	}
	if e.Operation() == jetstream.KeyValuePut && bad == nil {
		if l.Epoch == 0 {
			l.Epoch = e.Revision()
		}
		s.leases[e.Key()] = mirrored{lease: l, rev: e.Revision(), seen: time.Now()}
		after = &l
		if l.Module == "" {
			s.lastHeld[e.Key()] = l
			s.rememberHeld(e.Key(), l)
		}
	} else {
		delete(s.leases, e.Key())
	}
	notify := s.notify
	s.mu.Unlock()
	changed := (before == nil) != (after == nil) ||
		before != nil && after != nil && (before.Instance != after.Instance || before.Module != after.Module)
	if f := s.holderHook.Load(); f != nil && changed {
		(*f)(before, after)
	}
	for _, ch := range notify {
		select {
		case ch <- e.Key():
		default:
		}
	}
}

// decodeLease reads a lease from the bucket: untrusted input, checked against its key.
func decodeLease(key string, value []byte) (Lease, error) {
	var l Lease
	if err := json.Unmarshal(value, &l); err != nil {
		return Lease{}, fmt.Errorf("not a lease: %w", err)
	}
	switch {
	case l.Scope != manifest.ScopeMesh && l.Scope != manifest.ScopeNode:
		return Lease{}, fmt.Errorf("scope %.40q is neither %s nor %s", l.Scope, manifest.ScopeMesh, manifest.ScopeNode)
	case !manifest.ValidName(l.Seat):
		return Lease{}, fmt.Errorf("seat %.40q is not a seat name", l.Seat)
	case l.Node == "":
		return Lease{}, errors.New("the lease names no node")
	case Key(l.Seat, l.Scope, l.Node) != key:
		return Lease{}, fmt.Errorf("the lease of %s is not stored at %s", Key(l.Seat, l.Scope, l.Node), key)
	}
	return l, nil
}

// badLeaseTimeout bounds the delete of a refused lease record.
const badLeaseTimeout = 5 * time.Second

// deleteBad deletes the refused record at key if it is still at rev.
func (s *Store) deleteBad(key string, rev uint64) {
	defer s.repairs.Done()
	ctx, cancel := context.WithTimeout(context.Background(), badLeaseTimeout)
	defer cancel()
	err := s.kv.Delete(ctx, key, jetstream.LastRevision(rev))
	if err != nil && !mirror.Conflict(err) {
		s.logger().Warn("delete refused seat lease", "key", key, "err", err)
	}
}

// Get returns the lease of key from the mirror.
func (s *Store) Get(key string) (Lease, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.leases[key]
	return m.lease, ok
}

// LastHeld returns the lease of key now, or else the last one the mirror saw of a seat a
// node holds itself: between a holder's end and the next one's lease (an expiry, a watch
// taken up again after the bucket's leader moved) the node that held it last is still the
// one whose late events are its.
func (s *Store) LastHeld(key string) (Lease, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if m, ok := s.leases[key]; ok {
		return m.lease, true
	}
	l, ok := s.lastHeld[key]
	return l, ok
}

// heldHistory is how many node-held leases of a key HeldAt remembers: far more holders than
// a seat sees between an event and the audit log reading it.
const heldHistory = 64

// heldLease is a node-held lease HeldAt remembers, and when the mirror saw the next one
// (zero while it is the newest).
type heldLease struct {
	Lease
	ended time.Time
}

// rememberHeld keeps l among key's node-held leases by epoch (a renewal is the same lease).
// Under mu.
func (s *Store) rememberHeld(key string, l Lease) {
	h := s.heldAt[key]
	if n := len(h); n > 0 {
		if h[n-1].Epoch == l.Epoch {
			h[n-1].Lease = l
			return
		}
		h[n-1].ended = time.Now()
	}
	if len(h) == heldHistory {
		h = slices.Delete(h, 0, 1)
	}
	s.heldAt[key] = append(h, heldLease{Lease: l})
}

// HeldAt returns the node-held lease of key at epoch, if the mirror saw it since this node
// started: which node held the seat when it signed an event naming that epoch. ended is when
// the mirror saw the next lease of key (zero: none yet).
func (s *Store) HeldAt(key string, epoch uint64) (l Lease, ended time.Time, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, h := range s.heldAt[key] {
		if h.Epoch == epoch {
			return h.Lease, h.ended, true
		}
	}
	return Lease{}, time.Time{}, false
}

// Stale reports whether the mirror's lease of key has gone unrenewed for longer than the TTL:
// it has expired, or the mirror's watch is behind (it lags while a clustered stream elects a
// new leader). Either way only the bucket can say whether it is still held.
func (s *Store) Stale(key string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.leases[key]
	return ok && time.Since(m.seen) > s.ttl
}

// All returns every lease in the mirror.
func (s *Store) All() []Lease {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Lease, 0, len(s.leases))
	for _, m := range s.leases {
		out = append(out, m.lease)
	}
	return out
}

// acquire creates the lease; ErrHeld if someone holds it.
func (s *Store) acquire(ctx context.Context, l Lease) (uint64, error) {
	key := Key(l.Seat, l.Scope, l.Node)
	b, _ := json.Marshal(l)
	rev, err := s.kv.Create(ctx, key, b, jetstream.KeyTTL(s.ttl))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, ErrHeld
	}
	if err != nil {
		return 0, fmt.Errorf("acquire %s: %w", key, err)
	}
	return rev, nil
}

// renew republishes the lease at rev with a fresh TTL; ErrLost if it changed meanwhile.
func (s *Store) renew(ctx context.Context, l Lease, rev uint64) (uint64, error) {
	key := Key(l.Seat, l.Scope, l.Node)
	b, _ := json.Marshal(l)
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + Bucket + "." + key, Data: b},
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(s.ttl))
	if err != nil {
		if mirror.Conflict(err) {
			return 0, fmt.Errorf("%w: %s", ErrLost, key)
		}
		return 0, fmt.Errorf("renew %s: %w", key, err)
	}
	return ack.Sequence, nil
}

// release deletes the lease at rev; a lease already gone or taken is not an error.
func (s *Store) release(ctx context.Context, l Lease, rev uint64) error {
	key := Key(l.Seat, l.Scope, l.Node)
	if err := s.kv.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil && !mirror.Conflict(err) {
		return fmt.Errorf("release %s: %w", key, err)
	}
	return nil
}

// takeOver deletes a lease this node left behind when it stopped without releasing (a crash
// and restart faster than the TTL), so its own candidates need not wait for the expiry. It
// deletes only the revision the mirror shows: a mirror that lags (after a partition heals)
// must not delete the lease another node has taken since.
func (s *Store) takeOver(ctx context.Context, key string) error {
	s.mu.RLock()
	m, ok := s.leases[key]
	s.mu.RUnlock()
	if !ok {
		return nil
	}
	err := s.kv.Delete(ctx, key, jetstream.LastRevision(m.rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && !mirror.Conflict(err) {
		return err
	}
	return nil
}

func (l Lease) String() string {
	who := l.Instance
	if l.Module != "" {
		who = l.Module + "/" + l.Instance
	}
	return l.Seat + " held by " + who + " on " + l.Node + " (epoch " + strconv.FormatUint(l.Epoch, 10) + ")"
}
