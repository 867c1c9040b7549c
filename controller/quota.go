package controller

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
)

// EVENTS is shared: with only a byte limit on the whole stream, one module's flood filled it
// and every other module's emits were refused. So each module may hold at most
// module-events-max-bytes of it — its own events and its seats' — counted by the audit log,
// which sees every event the stream stores (audit.Usage). A module past its quota loses its
// permission to publish events on this node (every node decides alike from its own audit
// log) and its connections reconnect without it; it gets the permission back once its
// oldest events have aged out to below nine tenths of the quota, or the quota is raised.
// Nothing already accepted is evicted to make room.

// quotaInterval is how often usage is checked against the quota.
const quotaInterval = time.Second

// Quotas is which modules are over their quota on this node. The zero value holds none.
type Quotas struct {
	mu   sync.Mutex
	over map[string]api.Quota // module → its use when it went over
}

// Over reports whether module is over its quota, and its use then.
func (q *Quotas) Over(module string) (api.Quota, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	u, ok := q.over[module]
	return u, ok
}

// Usage is what quotas are checked against: the audit log's count of what each subject's
// owner holds of EVENTS.
type Usage interface {
	// Changes changes whenever the usage may have.
	Changes() uint64
	// Usage is the bytes each owner holds of the events younger than maxAge.
	Usage(maxAge time.Duration) map[string]int64
}

// Enforcement is what Enforce checks quotas with.
type Enforcement struct {
	Log *slog.Logger
	// Limit is module-events-max-bytes; zero or less: no quota.
	Limit int64
	// EventsMaxAge is how long EVENTS keeps an event: a module over its quota waits for its
	// oldest events to age out.
	EventsMaxAge time.Duration
	Registry     *registry.Registry
	Usage        Usage
	// Changed is told of a module going over its quota (event over-quota) or back under
	// (under-quota), with its use and the limit.
	Changed func(module, event string, used, limit int64)
}

// moduleUsage adds up what each registered module holds of EVENTS: its own namespace and
// the seats it declares (a seat's events are its holder's, and its holder is the module).
func moduleUsage(entries []*registry.Entry, used map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for _, e := range entries {
		n := used[audit.Owner(manifest.EventSubject(e.Module, "x"))]
		for _, s := range e.Manifest.Seats {
			n += used[audit.Owner(manifest.SeatEventSubject(s.Name, "x"))]
		}
		out[e.Module] = n
	}
	return out
}

// Enforce checks every module's use of EVENTS against the quota every quotaInterval until
// ctx ends. A module going over or back under is logged and told to e.Changed, which
// reports it and has its connections reconnect with the permissions that now apply.
func (q *Quotas) Enforce(ctx context.Context, e Enforcement) error {
	limit := e.Limit
	if limit <= 0 {
		<-ctx.Done() // no quota: the stream is not sized
		return nil
	}
	maxAge := e.EventsMaxAge
	t := time.NewTicker(quotaInterval)
	defer t.Stop()
	var logged, registered uint64 // what the last pass saw
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// Usage changes with new events and registrations; it falls with age too, which
		// matters only to a module over its quota. Otherwise there is nothing to look at: an
		// idle node with a thousand modules spent most of its CPU here.
		q.mu.Lock()
		anyOver := len(q.over) > 0
		q.mu.Unlock()
		l, r := e.Usage.Changes(), e.Registry.Revision()
		if !anyOver && l == logged && r == registered {
			continue
		}
		logged, registered = l, r
		use := moduleUsage(e.Registry.List(), e.Usage.Usage(maxAge))
		q.mu.Lock()
		if q.over == nil {
			q.over = map[string]api.Quota{}
		}
		before := maps.Clone(q.over)
		for module, used := range use {
			_, over := q.over[module]
			switch {
			case !over && used > limit:
				q.over[module] = api.Quota{Used: used, Limit: limit, Since: time.Now().UTC()}
			case over && used <= limit*9/10:
				delete(q.over, module)
			}
		}
		for module := range q.over {
			if _, ok := use[module]; !ok {
				delete(q.over, module) // removed
			}
		}
		after := maps.Clone(q.over)
		q.mu.Unlock()
		for module, u := range after {
			if _, was := before[module]; !was {
				e.Log.Warn("module over its EVENTS quota: its emits are refused until its oldest events age out",
					"module", module, "bytes", u.Used, "quota", limit, "events_max_age", maxAge)
				e.Changed(module, "over-quota", u.Used, limit)
			}
		}
		for module := range before {
			if _, still := after[module]; !still {
				e.Log.Info("module back under its EVENTS quota: its emits are accepted again", "module", module, "bytes", use[module], "quota", limit)
				e.Changed(module, "under-quota", use[module], limit)
			}
		}
	}
}

// quotaHint says what a module over its quota can do.
func quotaHint(q api.Quota, maxAge time.Duration) string {
	return "module holds " + config.Bytes(q.Used).String() + " of EVENTS, over its quota of " + config.Bytes(q.Limit).String() +
		": its emits are refused until its oldest events age out (events-max-age " + config.Duration(maxAge).String() +
		") to below nine tenths of it, or the operator raises module-events-max-bytes"
}
