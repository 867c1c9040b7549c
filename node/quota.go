package node

import (
	"context"
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

// quotas is which modules are over their quota on this node.
type quotas struct {
	mu   sync.Mutex
	over map[string]api.Quota // module → its use when it went over
}

// Over reports whether module is over its quota, and its use then.
func (q *quotas) Over(module string) (api.Quota, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	u, ok := q.over[module]
	return u, ok
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

// enforceQuotas checks every module's use of EVENTS against the quota every quotaInterval
// until ctx ends. A module going over or back under is logged, reported as a node event
// (over-quota, under-quota) and kicked, so its connections reconnect with the permissions
// that now apply (directory.Identity).
func (n *Node) enforceQuotas(ctx context.Context) error {
	limit := n.budget.Module
	if limit <= 0 {
		<-ctx.Done() // no quota: the stream is not sized
		return nil
	}
	maxAge := time.Duration(n.cfg.EventsMaxAge)
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
		n.quotas.mu.Lock()
		anyOver := len(n.quotas.over) > 0
		n.quotas.mu.Unlock()
		l, r := n.audit.Changes(), n.reg.Revision()
		if !anyOver && l == logged && r == registered {
			continue
		}
		logged, registered = l, r
		use := moduleUsage(n.reg.List(), n.audit.Usage(maxAge))
		n.quotas.mu.Lock()
		before := maps.Clone(n.quotas.over)
		for module, used := range use {
			_, over := n.quotas.over[module]
			switch {
			case !over && used > limit:
				n.quotas.over[module] = api.Quota{Used: used, Limit: limit, Since: time.Now().UTC()}
			case over && used <= limit*9/10:
				delete(n.quotas.over, module)
			}
		}
		for module := range n.quotas.over {
			if _, ok := use[module]; !ok {
				delete(n.quotas.over, module) // removed
			}
		}
		after := maps.Clone(n.quotas.over)
		n.quotas.mu.Unlock()
		for module, q := range after {
			if _, was := before[module]; !was {
				n.log.Warn("module over its EVENTS quota: its emits are refused until its oldest events age out",
					"module", module, "bytes", q.Used, "quota", limit, "events_max_age", maxAge)
				n.quotaChanged(module, "over-quota", q.Used, limit)
			}
		}
		for module := range before {
			if _, still := after[module]; !still {
				n.log.Info("module back under its EVENTS quota: its emits are accepted again", "module", module, "bytes", use[module], "quota", limit)
				n.quotaChanged(module, "under-quota", use[module], limit)
			}
		}
	}
}

// quotaChanged reports a module's crossing of its quota and kicks its connections on this
// node, so they reconnect under the permissions that now apply.
func (n *Node) quotaChanged(module, event string, used, limit int64) {
	publishNodeEvent(n.bus.Conn(), n.key, n.id.Name, event, map[string]any{
		"module": module, "bytes": used, "quota": limit, "quota_key": "module-events-max-bytes",
	}, n.log)
	if e, ok := n.reg.Get(module); ok {
		n.bus.Kick(e.PublicKey)
	}
}

// withoutEvents is p without the permission to publish events: what a module over its
// quota keeps.
func withoutEvents(p manifest.Permissions) manifest.Permissions {
	out := p
	out.Publish = nil
	for _, s := range p.Publish {
		if !manifest.IsEvent(s) {
			out.Publish = append(out.Publish, s)
		}
	}
	return out
}

// quotaHint says what a module over its quota can do.
func quotaHint(q api.Quota, maxAge time.Duration) string {
	return "module holds " + config.Bytes(q.Used).String() + " of EVENTS, over its quota of " + config.Bytes(q.Limit).String() +
		": its emits are refused until its oldest events age out (events-max-age " + config.Duration(maxAge).String() +
		") to below nine tenths of it, or the operator raises module-events-max-bytes"
}
