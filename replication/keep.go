package replication

import (
	"context"
	"log/slog"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/nats-io/nats.go/jetstream"
)

// Keeper brings the mesh's streams to the target replication while its node holds the
// controller's seat: at once when the count of servers changes the target, and again every
// Recheck (a stream made since at another count, one whose change failed).
type Keeper struct {
	JS jetstream.JetStream
	// Servers is how many servers the mesh has now; 0 when that is not known (the keeper
	// then changes nothing).
	Servers func() int
	// Holds reports whether this node holds the controller's seat: only its holder changes
	// the streams, so two nodes with different counts never fight.
	Holds func() bool
	// Recheck is how often every stream is looked at again though the target is unchanged.
	Recheck time.Duration
	Log     *slog.Logger
}

// Timing of Keeper.Run: how often it looks at the count of servers, how long one pass over
// the streams may take, and how long it waits after a pass that could not change every
// stream (too few servers up to place the copies: they come back, or are removed).
const (
	tick        = time.Second
	passTimeout = 30 * time.Second
	retryAfter  = 10 * time.Second
)

// Run keeps the replication until ctx ends.
func (k *Keeper) Run(ctx context.Context) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	var applied int    // the target the last complete pass reached; 0: none since holding
	var failed int     // the target the last pass could not reach; 0: it did
	var last time.Time // when the last pass was made
	var warned time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !k.Holds() {
			applied, failed = 0, 0
			continue
		}
		servers := k.Servers()
		if servers == 0 {
			continue // the count is not known now: keep what is
		}
		target := Target(servers)
		switch {
		case target == applied && time.Since(last) < k.Recheck:
			continue
		case target == failed && time.Since(last) < retryAfter:
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, passTimeout)
		changed, err := Streams(pctx, k.JS, target)
		cancel()
		last = time.Now()
		if len(changed) > 0 {
			k.Log.Info("replicating the mesh's streams to follow its servers", "servers", servers, "replicas", target,
				"tolerates_down", Tolerates(target), "streams", changed)
		}
		if err != nil {
			applied, failed = 0, target
			if time.Since(warned) > time.Minute {
				warned = time.Now()
				k.Log.Warn("some streams keep another number of copies than the mesh's servers call for; trying again", "servers", servers, "replicas", target, "err", err)
			}
			continue
		}
		applied, failed = target, 0
	}
}

// Status is the replication part of a node's status: the count of servers, the target, and
// each stream's replicas and quorum.
func Status(ctx context.Context, js jetstream.JetStream, servers int) *api.NodeReplication {
	target := Target(servers)
	r := &api.NodeReplication{Servers: servers, Target: target, Tolerates: Tolerates(target)}
	streams, err := Report(ctx, js)
	if err != nil {
		r.Error = err.Error()
	}
	r.Streams = streams
	return r
}

// Known is how many servers a keeper counts: the mesh's servers, but no more than JetStream
// knows as peers — and 0, unknown (the keeper then changes nothing), while this server's
// JetStream is switched off or, clustered, knows no peer: a holder that counted 1 then would
// cut every stream of the mesh down to one copy (the chaos harness saw it after a full disk).
func Known(servers, peers int, clustered, jetStreamOn bool) int {
	if !jetStreamOn || (peers == 0 && clustered) {
		return 0
	}
	return min(servers, max(peers, 1))
}
