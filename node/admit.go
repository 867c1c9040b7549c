package node

import (
	"context"
	"time"

	"github.com/meshnode/meshnode/admit"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nkeys"
)

// The node's admitter (package admit, DESIGN §14) takes what its modules publish to a stream
// under their own prefix and passes it on, or refuses it, before anything is stored. It needs
// the audit log (what each module holds of EVENTS, and when an admitted event is recorded),
// so it opens after it.

// openAdmitter starts the admitter on a connection of its own (admit.Permissions); Run's
// "admitter" actor keeps its lag current.
func (n *Node) openAdmitter(key nkeys.KeyPair) error {
	a, err := admit.New(admit.Config{
		Dial:         n.bus.Dial,
		Key:          key,
		Log:          n.log.With("component", "admit"),
		Limit:        n.budget.Module,
		EventsMaxAge: time.Duration(n.cfg.EventsMaxAge),
		Rate:         float64(n.cfg.EmitRate),
		Burst:        max(n.cfg.EmitRate/4, 1), // a second's burst held other modules' emits behind it in EVENTS
		MaxLag:       uint64(n.cfg.AuditMaxLag),
		Held:         n.audit.Held,
		Owners:       n.usageOwners,
		Flooding:     func(module string, refused uint64) { n.floodingCaller(module, int(refused)) },
	})
	if err != nil {
		return err
	}
	n.admit = a
	n.audit.Recorded = a.Recorded
	n.closers.PushFunc("admitter", func() { a.Close() })
	return nil
}

// runAdmitter keeps the admitter's back-pressure lag current until ctx ends.
func (n *Node) runAdmitter(ctx context.Context) error {
	return n.admit.Run(ctx, admit.Watch{JS: n.bus.JetStream(), Members: n.liveMembers, Self: n.id.Name})
}

// quotaUse is each module's use of EVENTS against its quota, as this node's admitter sees it.
func (n *Node) quotaUse(modules []string) []api.QuotaUse {
	if n.admit == nil {
		return nil // not open yet: nothing admitted
	}
	return n.admit.Use(modules)
}

// usageOwners are the usage owners whose events count against module's quota: its own
// namespace and each seat it declares (a seat's events are its holder's, an instance of the
// module).
func (n *Node) usageOwners(module string) []string {
	owners := []string{audit.Owner(manifest.EventSubject(module, "x"))}
	if e, ok := n.reg.Get(module); ok {
		for _, s := range e.Manifest.Seats {
			owners = append(owners, audit.Owner(manifest.SeatEventSubject(s.Name, "x")))
		}
	}
	return owners
}

// liveMembers are the servers of the mesh that are up, this one among them.
func (n *Node) liveMembers() []string {
	if n.mesh.members == nil {
		return []string{n.id.Name}
	}
	var out []string
	for _, m := range n.Members() {
		if m.State == "alive" {
			out = append(out, m.Name)
		}
	}
	return out
}
