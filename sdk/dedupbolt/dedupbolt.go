package dedupbolt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/sdk"
	bolt "go.etcd.io/bbolt"
)

// Dedup is sdk.Dedup that survives a restart: the handled events' ids are kept in a bbolt
// file of the module's own, per handler name, the newest size of each. Once marks an event
// after its handler succeeded, so a crash between the two runs the handler again on
// redelivery (at least once, as always); Atomically runs the handler inside the transaction
// that marks it, so work the module keeps in the same file is done exactly once per id.
//
// One process opens a file at a time (bbolt locks it): instances of a module on one machine
// each need their own, and instances elsewhere dedup only what they handle themselves.
type Dedup struct {
	db   *bolt.DB
	size int
}

// Open opens (or creates) the dedup file at path, keeping the last size ids of each handler.
func Open(path string, size int) (*Dedup, error) {
	if size < 1 {
		size = 1
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open dedup file %s: %w (another process of the module may hold it)", path, err)
	}
	return &Dedup{db: db, size: size}, nil
}

// Close closes the file.
func (d *Dedup) Close() error { return d.db.Close() }

// Seen reports whether handler name completed the event id.
func (d *Dedup) Seen(name, id string) (bool, error) {
	var seen bool
	err := d.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(dedupBucket(name)); b != nil {
			seen = b.Bucket(dedupIDs).Get([]byte(id)) != nil
		}
		return nil
	})
	return seen, err
}

// Once wraps h so that handler name runs each event id successfully at most once within the
// newest size ids, across restarts.
func (d *Dedup) Once(name string, h sdk.Handler) sdk.Handler {
	return func(ctx context.Context, e sdk.Event) error {
		seen, err := d.Seen(name, e.ID)
		if err != nil {
			return fmt.Errorf("dedup %s: %w", name, err)
		}
		if seen {
			return nil
		}
		if err := h(ctx, e); err != nil {
			return err
		}
		return d.db.Update(func(tx *bolt.Tx) error { return d.mark(tx, name, e.ID) })
	}
}

// TxHandler handles an event inside the transaction that marks it done: whatever it writes
// to tx is committed with the mark, or, when it returns an error, not at all.
type TxHandler func(ctx context.Context, e sdk.Event, tx *bolt.Tx) error

// Atomically wraps h so that the check, h's writes and the mark are one transaction: an event
// id is handled exactly once per handler name, as far as the work is in this file.
func (d *Dedup) Atomically(name string, h TxHandler) sdk.Handler {
	return func(ctx context.Context, e sdk.Event) error {
		err := d.db.Update(func(tx *bolt.Tx) error {
			if b := tx.Bucket(dedupBucket(name)); b != nil && b.Bucket(dedupIDs).Get([]byte(e.ID)) != nil {
				return errHandled
			}
			if err := h(ctx, e, tx); err != nil {
				return err
			}
			return d.mark(tx, name, e.ID)
		})
		if errors.Is(err, errHandled) {
			return nil
		}
		return err
	}
}

// errHandled ends a transaction that found its event already handled.
var errHandled = errors.New("handled already")

// The file's layout: a bucket per handler name holding ids (id → order) and order (a
// sequence → id), so the oldest id is the first key of order.
var (
	dedupIDs   = []byte("ids")
	dedupOrder = []byte("order")
)

func dedupBucket(name string) []byte { return []byte("dedup:" + name) }

// mark records id as handled by name, forgetting the oldest ids past size.
func (d *Dedup) mark(tx *bolt.Tx, name, id string) error {
	b, err := tx.CreateBucketIfNotExists(dedupBucket(name))
	if err != nil {
		return err
	}
	ids, err := b.CreateBucketIfNotExists(dedupIDs)
	if err != nil {
		return err
	}
	order, err := b.CreateBucketIfNotExists(dedupOrder)
	if err != nil {
		return err
	}
	if ids.Get([]byte(id)) != nil {
		return nil
	}
	seq, _ := order.NextSequence()
	key := binary.BigEndian.AppendUint64(nil, seq)
	if err := order.Put(key, []byte(id)); err != nil {
		return err
	}
	if err := ids.Put([]byte(id), key); err != nil {
		return err
	}
	// Only the oldest are ever removed, so order's keys run without a gap from its first.
	c := order.Cursor()
	for k, old := c.First(); k != nil && seq-binary.BigEndian.Uint64(k)+1 > uint64(d.size); k, old = c.First() {
		if err := ids.Delete(old); err != nil {
			return err
		}
		if err := order.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
