package alarm

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
)

// Set is a node's standing alarms, by key. The zero Set has none; it is safe for
// concurrent use.
type Set struct {
	mu sync.Mutex
	by map[string]string
}

// Set raises (or restates) the alarm under key; it reports whether the reason is new.
func (a *Set) Set(key, reason string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.by == nil {
		a.by = map[string]string{}
	}
	changed := a.by[key] != reason
	a.by[key] = reason
	return changed
}

// Clear drops the alarm under key; it reports whether there was one.
func (a *Set) Clear(key string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, had := a.by[key]
	delete(a.by, key)
	return had
}

// Err is every standing alarm as one error, their reasons in the order of their keys; nil
// when there is none.
func (a *Set) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.by) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(a.by))
	reasons := make([]string, len(keys))
	for i, k := range keys {
		reasons[i] = a.by[k]
	}
	return errors.New(strings.Join(reasons, "; "))
}
