package sdk

import (
	"context"
	"sync"
)

// Dedup remembers the x-event-id of the newest events a handler completed, so a redelivered
// event (delivery is at least once) is acknowledged without running the handler again. It
// lives in memory: package dedupbolt's Dedup survives restarts (in a bbolt file, so only a
// module that imports it links bbolt).
type Dedup struct {
	mu   sync.Mutex
	size int
	ring []string
	next int
	seen map[string]struct{}
}

// NewDedup remembers the last size event ids.
func NewDedup(size int) *Dedup {
	if size < 1 {
		size = 1
	}
	return &Dedup{size: size, ring: make([]string, size), seen: make(map[string]struct{}, size)}
}

// Seen reports whether id was marked done.
func (d *Dedup) Seen(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.seen[id]
	return ok
}

// Done marks id done, forgetting the oldest id when full.
func (d *Dedup) Done(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.seen[id]; ok {
		return
	}
	if old := d.ring[d.next]; old != "" {
		delete(d.seen, old)
	}
	d.ring[d.next] = id
	d.next = (d.next + 1) % d.size
	d.seen[id] = struct{}{}
}

// Once wraps h so each event id is handled successfully at most once (within the window).
func (d *Dedup) Once(h Handler) Handler {
	return func(ctx context.Context, e Event) error {
		if d.Seen(e.ID) {
			return nil
		}
		if err := h(ctx, e); err != nil {
			return err
		}
		d.Done(e.ID)
		return nil
	}
}
