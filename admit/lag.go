package admit

import (
	"context"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
)

// lagEvery is how often the admitter reads the audit consumers' lag: at the mesh's highest
// emit rate the lag moves by a few thousand events a second, so audit-max-lag is overshot by
// a fraction of a second's worth at most.
const lagEvery = 250 * time.Millisecond

// Watch is what Run reads the lag from: the mesh's JetStream, the live members' names (this
// node's among them) and this node's.
type Watch struct {
	JS      jetstream.JetStream
	Members func() []string
	Self    string
}

// Run keeps the back-pressure's lag current and sweeps what will never be recorded until
// ctx ends. The lag is the largest among the live members whose audit log has caught up
// (within MaxLag) since it was last seen live: a member back from an absence reads what
// EVENTS kept while the mesh goes on — what it can no longer read is a gap its log records —
// and slows emitters only once it is in step again.
func (a *Admitter) Run(ctx context.Context, w Watch) error {
	t := time.NewTicker(lagEvery)
	defer t.Stop()
	inStep := map[string]bool{}
	var sweptAt time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		var worst, own uint64
		live := map[string]bool{}
		for _, m := range w.Members() {
			live[m] = true
			lag, ok := auditLag(ctx, w.JS, m)
			if !ok {
				continue // no answer: its lag is unknown, not zero; the next round asks again
			}
			if m == w.Self {
				own = lag
			}
			if !inStep[m] && (a.cfg.MaxLag == 0 || lag <= a.cfg.MaxLag) {
				inStep[m] = true
			}
			if inStep[m] {
				worst = max(worst, lag)
			}
		}
		for m := range inStep {
			if !live[m] {
				delete(inStep, m)
			}
		}
		a.SetLag(worst)
		if time.Since(sweptAt) >= time.Second {
			a.Sweep(own == 0)
			sweptAt = time.Now()
		}
	}
}

// auditLag is how many events member's audit consumer has yet to read or acknowledge.
func auditLag(ctx context.Context, js jetstream.JetStream, member string) (uint64, bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, manifest.EventsStreamName, manifest.AuditConsumer(member).Name)
	if err != nil {
		return 0, false
	}
	info := c.CachedInfo()
	return info.NumPending + uint64(info.NumAckPending), true
}
