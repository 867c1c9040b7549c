// Package boundedmap is a map shared between goroutines that forgets everything at once
// when it would grow past its bound: for caches of derived keys, where a flood of new keys
// must cost recomputation, never memory.
package boundedmap

import "sync"

// Map is a bounded map from K to V, safe for concurrent use. The zero value is not usable:
// make one with New.
type Map[K comparable, V any] struct {
	mu   sync.RWMutex
	m    map[K]V
	most int
}

// New returns a Map that holds at most most entries.
func New[K comparable, V any](most int) *Map[K, V] {
	return &Map[K, V]{m: map[K]V{}, most: most}
}

// Get returns the value kept for k.
func (b *Map[K, V]) Get(k K) (V, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	v, ok := b.m[k]
	return v, ok
}

// Put keeps v for k; a Map at its bound forgets every other entry first.
func (b *Map[K, V]) Put(k K, v V) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.m[k]; !ok && len(b.m) >= b.most {
		clear(b.m)
	}
	b.m[k] = v
}
