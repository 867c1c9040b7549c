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
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrClosed means the watch ended on its own: before the bucket's current values were all
// in (Open, Rewatch), or while following it (Run).
var ErrClosed = errors.New("watch closed")

// Watch follows one KV bucket into its owner's mirror.
type Watch struct {
	kv       jetstream.KeyValue
	subjects []string // the keys watched; none: all
	apply    func(jetstream.KeyValueEntry)

	rewatching sync.Mutex // one Rewatch at a time

	mu    sync.Mutex
	w     jetstream.KeyWatcher // the current watcher: Rewatch replaces it
	ended jetstream.KeyWatcher // the watcher whose end Run last reported
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
	w, err := m.watch()
	if err != nil {
		return nil, err
	}
	if err := load(ctx, w, m.apply); err != nil {
		w.Stop()
		return nil, err
	}
	return w, nil
}

// watch starts a new watcher of the bucket's keys.
func (m *Watch) watch() (jetstream.KeyWatcher, error) {
	if len(m.subjects) == 0 {
		return m.kv.WatchAll(context.Background())
	}
	return m.kv.WatchFiltered(context.Background(), m.subjects)
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
		if m.w == w {
			m.apply(e)
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
	w, err := m.watch()
	if err != nil {
		return err
	}
	m.mu.Lock() // waits for an entry of the old watch being applied
	old := m.w
	m.w = w
	m.mu.Unlock()
	stop(old) // its follow ends; Run takes the new watch up once it is loaded
	reset()
	if err := load(ctx, w, m.apply); err != nil {
		w.Stop() // Run ends with ErrClosed on it: the owner retakes
		return err
	}
	return nil
}

// Close stops the watch; the owner's mirror keeps its last state.
func (m *Watch) Close() error { return stop(m.current()) }

// load applies every entry w delivers until the bucket's current values are all in (the
// watch's nil marker). If ctx ends first it stops w and returns ctx's error.
func load(ctx context.Context, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry)) error {
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return ErrClosed
			}
			if e == nil {
				return nil
			}
			apply(e)
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
