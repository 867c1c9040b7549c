// Package jsretry asks a clustered JetStream again while it settles: the node's opening steps
// and the controller's reads of the mesh's buckets and streams.
package jsretry

import (
	"context"
	"errors"
	"time"

	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Do runs f with a fresh context until it succeeds or ctx ends. A clustered JetStream
// drops an API request sent while it has no leader for the asset (the meta group's, or a new
// stream's) — the request is never answered — so a step (of a node's Open, say) asks again rather than wait
// out its whole budget on one lost request. The first attempts are short (an answered request
// takes milliseconds; a dropped one would cost the whole attempt), later ones longer (a
// stream placed on a busy cluster can take seconds to answer).
func Do(ctx context.Context, f func(context.Context) error) error {
	attempt := 250 * time.Millisecond
	pause := backoff.Backoff{First: 20 * time.Millisecond, Max: 2 * time.Second}
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err := f(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !retryable(err) {
			return err
		}
		attempt = min(2*attempt, 5*time.Second)
		if pause.Wait(ctx) != nil {
			return err
		}
	}
}

// retryable reports whether a JetStream request's error is one a clustered JetStream gives
// while it settles (no leader yet, no peers placed yet, a peer change in flight), told by type
// and by nats-server's error code, never by text.
func retryable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, embedbus.ErrChangeInFlight) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch server.ErrorIdentifier(apiErr.ErrorCode) {
		case server.JSClusterNotAvailErr, server.JSClusterNoPeersErrF, server.JSClusterNotLeaderErr:
			return true
		case server.JSStreamNameExistErr:
			// Two nodes created a stream at once with configurations that differ (each sizes
			// the mesh's streams from its own store): asked again, the update path settles it.
			return true
		}
	}
	return false
}
