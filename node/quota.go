package node

import (
	"context"
	"time"

	"github.com/meshnode/meshnode/controller"
	"github.com/meshnode/meshnode/manifest"
)

// EVENTS is shared, so each module may hold at most module-events-max-bytes of it
// (controller.Quotas). A module past its quota loses its permission to publish events on
// this node (directory.Identity) and its connections reconnect without it.

// enforceQuotas checks every module's use of EVENTS, as this node's audit log counts it,
// against the quota until ctx ends.
func (n *Node) enforceQuotas(ctx context.Context) error {
	return n.dir.quotas.Enforce(ctx, controller.Enforcement{
		Log: n.log, Limit: n.budget.Module, EventsMaxAge: time.Duration(n.cfg.EventsMaxAge),
		Registry: n.reg, Usage: n.audit, Changed: n.quotaChanged,
	})
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
