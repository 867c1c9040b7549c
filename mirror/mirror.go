// Package mirror keeps an in-memory copy of a JetStream KV bucket through a watch: the one
// loop behind the registry's, the seats' and the vault's mirrors. A Watch owns the watcher
// and its life — the load of the bucket's current values, following its changes, a fresh
// start after the bucket was made again, the stop — and hands every entry to its owner's
// apply, which keeps the owner's maps (each with its own indexes and invariants) under the
// owner's lock.
package mirror

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/internal/backoff"
)

// ErrClosed means the watch ended on its own: before the bucket's current values were all
// in (Open, Rewatch), or while following it (Run).
var ErrClosed = errors.New("watch closed")

// Watch follows one KV bucket into its owner's mirror.
type Watch struct {
	kv       jetstream.KeyValue
	subjects []string // the keys watched; none: all
	apply    func(jetstream.KeyValueEntry)

	rewatching sync.Mutex     // one Rewatch or Resume at a time
	stopping   sync.WaitGroup // the stops of watches Resume replaced

	mu     sync.Mutex
	w      jetstream.KeyWatcher // the current watcher: Rewatch and Resume replace it
	ended  jetstream.KeyWatcher // the watcher whose end Run last reported
	last   uint64               // the highest revision applied
	floor  uint64               // the current watcher's entries at or below it are applied already
	closed bool                 // Close was called: Rewatch and Resume make no new watch
}

// Open watches kv's keys (all of them when keys is empty) and applies every current value
// before it returns; Run must then follow. ctx bounds only the load: the watch outlives it
// until Close.
func Open(ctx context.Context, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry), keys ...string) (*Watch, error) {
	m := &Watch{kv: kv, subjects: keys, apply: apply}
	w, err := m.start(ctx)
	if err != nil {
		return nil, err
	}
	m.w = w
	return m, nil
}

// start starts a new watcher and applies the bucket's current values from it.
func (m *Watch) start(ctx context.Context) (jetstream.KeyWatcher, error) {
	until := m.lastSeq(ctx)
	w, err := m.watch()
	if err != nil {
		return nil, err
	}
	if err := load(ctx, w, m.applyLoaded, until); err != nil {
		w.Stop()
		return nil, err
	}
	return w, nil
}

// applyLoaded applies an entry of a watch's load, which has Run wait (rewatching).
func (m *Watch) applyLoaded(e jetstream.KeyValueEntry) {
	m.apply(e)
	m.mu.Lock()
	m.last = max(m.last, e.Revision())
	m.mu.Unlock()
}

// watch starts a new watcher of the bucket's keys.
func (m *Watch) watch(opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	if len(m.subjects) == 0 {
		return m.kv.WatchAll(context.Background(), opts...)
	}
	// A copy: nats.go rewrites the keys it is given into subjects, in place.
	return m.kv.WatchFiltered(context.Background(), slices.Clone(m.subjects), opts...)
}

// current is the watcher Run follows now.
func (m *Watch) current() jetstream.KeyWatcher {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.w
}

// Run applies the bucket's changes until ctx ends (nil) or the watch closes on its own
// (ErrClosed). A watch replaced by Rewatch is no end: Run follows the new one once it is
// loaded.
func (m *Watch) Run(ctx context.Context) error {
	for {
		m.rewatching.Lock() // a Rewatch loading its new watch ends first
		w := m.current()
		m.rewatching.Unlock()
		err := follow(ctx, w, m.applyFrom(w))
		if ctx.Err() != nil {
			return err
		}
		m.mu.Lock()
		replaced := m.w != w
		if !replaced {
			m.ended = w
		}
		m.mu.Unlock()
		if !replaced {
			return err
		}
	}
}

// applyFrom applies the entries of w while it is the current watch: once Rewatch replaced it,
// what it still delivers (the old bucket's last changes) would be stale in the new mirror.
func (m *Watch) applyFrom(w jetstream.KeyWatcher) func(jetstream.KeyValueEntry) {
	return func(e jetstream.KeyValueEntry) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.w == w && e.Revision() > m.floor {
			m.apply(e)
			m.last = max(m.last, e.Revision())
		}
	}
}

// Rewatch follows the bucket afresh after it was deleted and made again: a watch that
// outlived the bucket resumes at the old bucket's last sequence, which the new one reaches
// only after as many writes, so the mirror would stay blind as long. The new watch replaces
// the old one first (whose entries are ignored from then on), reset empties the owner's
// mirror, and the new bucket's values are loaded; Run then follows the new watch. If the
// load fails, Run ends with ErrClosed and the owner retakes the watch (Retake).
func (m *Watch) Rewatch(ctx context.Context, reset func()) error {
	m.rewatching.Lock()
	defer m.rewatching.Unlock()
	return m.rewatch(ctx, reset)
}

// Retake is Rewatch after Run ended on its own (ErrClosed), unless another Rewatch has given
// Run a new watch meanwhile: then there is nothing to retake.
func (m *Watch) Retake(ctx context.Context, reset func()) error {
	m.rewatching.Lock()
	defer m.rewatching.Unlock()
	m.mu.Lock()
	stale := m.w == m.ended
	m.mu.Unlock()
	if !stale {
		return nil
	}
	return m.rewatch(ctx, reset)
}

// rewatch is Rewatch under m.rewatching. A bucket that does not answer yet leaves the watch
// and the mirror as they were.
func (m *Watch) rewatch(ctx context.Context, reset func()) error {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return ErrClosed
	}
	until := m.lastSeq(ctx)
	w, err := m.watch()
	if err != nil {
		return err
	}
	m.mu.Lock() // waits for an entry of the old watch being applied
	old := m.w
	m.w, m.last, m.floor = w, 0, 0 // a new bucket counts its revisions from 1
	m.mu.Unlock()
	stop(old) // its follow ends; Run takes the new watch up once it is loaded
	reset()
	if err := load(ctx, w, m.applyLoaded, until); err != nil {
		w.Stop() // Run ends with ErrClosed on it: the owner retakes
		return err
	}
	return nil
}

// Resume replaces the watch with one that starts after the last revision applied, keeping
// the mirror as it is. The watch's consumer is an ordered consumer: one replica, on the server
// that led the stream when it was made, and lost with that server. nats.go makes a new one
// only after two missed heartbeats, 10 to 20 s, during which the mirror is blind; an owner
// that waits for its own write to arrive (Awaiting) need not wait that long. If the stream
// has no leader yet, nothing changes and the error says why.
func (m *Watch) Resume() error {
	m.rewatching.Lock()
	defer m.rewatching.Unlock()
	m.mu.Lock()
	from, closed := m.last+1, m.closed
	m.mu.Unlock()
	if closed {
		return ErrClosed
	}
	w, err := m.watch(jetstream.ResumeFromRevision(from))
	if err != nil {
		return fmt.Errorf("watch %s again from revision %d: %w", m.kv.Bucket(), from, err)
	}
	m.mu.Lock()
	old := m.w
	m.w, m.floor = w, m.last // what the old watch applied meanwhile is not applied twice
	m.mu.Unlock()
	// Its follow ends at once; the stop then asks to delete its consumer, which may wait for
	// a server that is gone.
	m.stopping.Add(1)
	go func() {
		defer m.stopping.Done()
		stop(old)
	}()
	return nil
}

// Stall is how long an owner's wait for its own write lasts before the watch is resumed.
const Stall = time.Second

// Awaiting covers an owner's wait for a write of its own to reach the mirror, until the
// returned func is called: once the wait has lasted Stall, and again after growing waits,
// the watch is resumed (Resume), and report is told the outcome.
func (m *Watch) Awaiting(ctx context.Context, report func(error)) (done func()) {
	ctx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		b := backoff.Backoff{First: Stall, Max: 4 * Stall}
		for b.Wait(ctx) == nil {
			report(m.Resume())
		}
	}()
	return func() {
		cancel()
		<-finished
	}
}

// Close stops the watch; the owner's mirror keeps its last state.
func (m *Watch) Close() error {
	first := m.current()
	err := stop(first)  // ends a load under way, too
	m.rewatching.Lock() // then no Rewatch or Resume is under way, and none starts after
	m.mu.Lock()
	m.closed = true
	last := m.w
	m.mu.Unlock()
	m.rewatching.Unlock()
	if last != first {
		err = stop(last)
	}
	m.stopping.Wait()
	return err
}

// lastSeq is the bucket's last sequence as the stream's leader tells it, for a watch of the
// whole bucket whose last message stays (no TTL, not empty); 0 otherwise, or if the leader
// does not answer. The watch's ordered consumer is one replica, placed on any server of the
// stream, caught up or not: on a server still catching up (just joined, or restarted) its
// "current values are all in" comes early, and a load that took it for the end would leave
// the mirror without the newest records (a grown server refused a registered module's key).
// Every message at or below it is a current value or was replaced by a later one, so the
// load goes on until it has applied a revision at least this high.
func (m *Watch) lastSeq(ctx context.Context) uint64 {
	if len(m.subjects) > 0 {
		return 0
	}
	st, err := m.kv.Status(ctx)
	if err != nil || st.TTL() > 0 || st.Values() == 0 {
		return 0
	}
	if info, ok := st.(interface{ StreamInfo() *jetstream.StreamInfo }); ok && info.StreamInfo() != nil {
		return info.StreamInfo().State.LastSeq
	}
	return 0
}

// load applies every entry w delivers until the bucket's current values are all in (the
// watch's nil marker) and it has applied a revision at least until. If ctx ends first it
// stops w and returns ctx's error.
func load(ctx context.Context, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry), until uint64) error {
	var last uint64
	marked := false
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return ErrClosed
			}
			if e == nil {
				marked = true
			} else {
				apply(e)
				last = max(last, e.Revision())
			}
			if marked && last >= until {
				return nil
			}
		case <-ctx.Done():
			w.Stop()
			return ctx.Err()
		}
	}
}

// follow applies the changes w delivers until ctx ends (nil) or the watch closes on its own
// (ErrClosed: the mirror no longer follows the bucket, which its owner must not take for a
// stop). It does not stop w: the owner does, on close.
func follow(ctx context.Context, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry)) error {
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return ErrClosed
			}
			if e != nil {
				apply(e)
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// Conflict reports whether a conditional KV write lost a race: the key already exists
// (Create), or its last revision is not the one the write expected (Update, or a publish or
// delete with an expected last sequence).
func Conflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// stop stops a watch. A bucket deleted under it is no error of the watcher's: the node's
// drift check reports the loss (its stop would otherwise fail with "stream not found").
func stop(w jetstream.KeyWatcher) error {
	err := w.Stop()
	// The watch's subscription reports the stream's absence with nats.go's own errors.
	if errors.Is(err, nats.ErrStreamNotFound) || errors.Is(err, nats.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	return err
}
