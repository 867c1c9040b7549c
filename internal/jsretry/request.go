package jsretry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/internal/backoff"
)

// nats-server's error codes (server.ErrorIdentifier) for a cluster that is settling; named
// here so the package links no server (a test checks them against nats-server's own).
const (
	codeClusterNoPeers   jetstream.ErrorCode = 10005 // JSClusterNoPeersErrF: no peers placed yet
	codeClusterNotAvail  jetstream.ErrorCode = 10008 // JSClusterNotAvailErr: no meta leader yet
	codeClusterNotLeader jetstream.ErrorCode = 10009 // JSClusterNotLeaderErr: a leader change in flight
	codeStreamNameExist  jetstream.ErrorCode = 10058 // JSStreamNameExistErr: created at once with another configuration
	codeMsgIDInProcess   jetstream.ErrorCode = 10158 // JSStreamDuplicateMessageConflict: the same Nats-Msg-Id still being stored
)

// ErrSettling marks an error of the mesh's own making that a settling cluster gives (a peer
// change already in flight): wrap it, and Request asks again.
var ErrSettling = errors.New("the cluster is settling")

// Settling reports whether err is one a clustered JetStream gives while it settles, so an
// idempotent request is worth asking again.
func Settling(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrSettling) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case codeClusterNotAvail, codeClusterNoPeers, codeClusterNotLeader:
			return true
		case codeStreamNameExist:
			// Two nodes created a stream at once with configurations that differ (each sizes
			// the mesh's streams from its own store): asked again, the update path settles it.
			return true
		}
	}
	return false
}

// InProcess reports whether err is a clustered stream's answer to a message whose
// Nats-Msg-Id an earlier send of it is still being stored under (proposed to the stream's
// peers, not yet applied): neither stored nor refused. Sent again a little later, it is
// acked as a duplicate once the first is stored, or stored if the first was lost with a
// leader.
func InProcess(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == codeMsgIDInProcess
}

// Stored is a publish's outcome for Request: an error that means the message found no stream
// to store it (Leaderless: EVENTS electing a leader), or that an earlier attempt's copy is
// still being stored (InProcess: the earlier attempt's answer came too late for its
// deadline), is Settling. Only for a message a second copy of which the stream drops or
// refuses: its Nats-Msg-Id makes it a duplicate, or its expected last sequence has moved on.
func Stored(_ *jetstream.PubAck, err error) error {
	if Leaderless(err) || InProcess(err) {
		return fmt.Errorf("%w: %w", ErrSettling, err)
	}
	return err
}

// Publish stores m, acked, asked again while its stream has no leader (for Patience when ctx
// has no deadline). Only for a message whose Nats-Msg-Id makes a second copy a duplicate the
// stream drops.
func Publish(ctx context.Context, js jetstream.JetStream, m *nats.Msg) error {
	ctx, cancel := Patient(ctx)
	defer cancel()
	return Request(ctx, func(ctx context.Context) error { return Stored(js.PublishMsg(ctx, m)) })
}

// Request runs the idempotent request f with a fresh context until it succeeds, fails
// otherwise than Settling, or ctx ends. The first attempts are short (an answered request
// takes milliseconds; a dropped one would cost the whole attempt), later ones longer (a
// stream placed on a busy cluster can take seconds to answer).
func Request(ctx context.Context, f func(context.Context) error) error {
	attempt := 250 * time.Millisecond
	pause := backoff.Backoff{First: 20 * time.Millisecond, Max: 2 * time.Second}
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err := f(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !Settling(err) {
			return err
		}
		attempt = min(2*attempt, 5*time.Second)
		if pause.Wait(ctx) != nil {
			return err
		}
	}
}
