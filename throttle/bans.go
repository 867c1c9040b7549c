package throttle

import (
	"sync"
	"time"
)

// A Gate refuses a request past an identity's rate, and a refusal costs the node a map
// lookup; but an identity that keeps on past its refusals still costs its connection's
// reading, routing and the dropping of every request, and a flood on a path no Gate guards
// (tool calls between modules) costs that and more. Such an identity is barred: disconnected
// and refused at the door for a while, longer each time it comes back flooding.

// Bans is the back-off of the identities barred for flooding: the first bar lasts First,
// each one after twice the one before, up to Max; an identity quiet for twice its last bar
// after that bar ended starts at First again.
type Bans struct {
	first, max time.Duration

	mu sync.Mutex
	m  map[string]*ban
}

type ban struct {
	until   time.Time
	length  time.Duration // of the last bar
	strikes int           // bars in a row, without a quiet period between
}

// NewBans returns the back-off of first doubling up to longest (below first: first).
func NewBans(first, longest time.Duration) *Bans {
	return &Bans{first: first, max: max(first, longest), m: map[string]*ban{}}
}

// Strike bars identity from now: until is when the bar ends, strikes how many bars in a
// row it has had, this one included. An identity already barred is not barred again (its
// connections were still being closed): ok is false.
func (b *Bans) Strike(identity string, now time.Time) (until time.Time, strikes int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.forget(now)
	bn := b.m[identity]
	switch {
	case bn == nil:
		bn = &ban{length: b.first}
		b.m[identity] = bn
	case now.Before(bn.until):
		return bn.until, bn.strikes, false
	default:
		bn.length = min(2*bn.length, b.max)
	}
	bn.strikes++
	bn.until = now.Add(bn.length)
	return bn.until, bn.strikes, true
}

// Len is how many identities are barred at now.
func (b *Bans) Len(now time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, bn := range b.m {
		if now.Before(bn.until) {
			n++
		}
	}
	return n
}

// forget drops the identities quiet long enough to start at First again (under mu).
func (b *Bans) forget(now time.Time) {
	for id, bn := range b.m {
		if now.Sub(bn.until) >= 2*bn.length {
			delete(b.m, id)
		}
	}
}
