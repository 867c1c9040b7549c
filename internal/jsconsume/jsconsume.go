// Package jsconsume is the mesh's one way to consume a JetStream consumer for as long as a
// part runs: find the consumer (asking again with back-off while the cluster settles or the
// consumer is not made yet), consume it, and start over when the consumption ends on its own
// — the consumer or its stream was deleted (drift repair makes them again) — until the
// caller's context ends.
package jsconsume

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/internal/backoff"
)

// Consumer is what Run consumes.
type Consumer struct {
	// What names the consumer in the log ("the controller's work queue").
	What string
	// Get finds or makes the consumer (jetstream.Stream.Consumer, CreateOrUpdateConsumer).
	Get func(context.Context) (jetstream.Consumer, error)
	// Handle takes each message; it acks, naks or terminates it.
	Handle jetstream.MessageHandler
	// Options are the pull's options (batch sizes); Run adds its own heartbeat (PullHeartbeat)
	// and error handler.
	Options []jetstream.PullConsumeOpt
	// Log is told when the consumer does not answer or its consumption ends; nil discards.
	Log *slog.Logger
	// Retry is the back-off between attempts to find the consumer; zero is the package's.
	Retry backoff.Backoff
}

// PullHeartbeat is how often the server tells a waiting pull it is still there. A pull can be
// lost without a word — sent while a clustered consumer elects a leader, or waiting at a leader
// that is killed or cut off before its followers learn of it — and the client notices only when
// two heartbeats are missed, then pulls again. nats.go's default is half the pull's 30 s expiry,
// so a lost pull left a consumer (a seat's holder among them) idle for 30 s with its messages
// piling up; with this one, for about 4 s. A heartbeat is a few bytes per waiting pull.
const PullHeartbeat = 2 * time.Second

// Retry is the back-off between attempts to find the consumer.
var Retry = backoff.Backoff{First: 200 * time.Millisecond, Max: 5 * time.Second}

// Run consumes c until ctx ends, and returns then. Handle is never running once Run returned.
func Run(ctx context.Context, c Consumer) {
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wait := c.Retry
	if wait == (backoff.Backoff{}) {
		wait = Retry
	}
	for ctx.Err() == nil {
		cons, err := c.Get(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn(c.What+" does not answer yet", "err", err)
			}
			if wait.Wait(ctx) != nil {
				return
			}
			continue
		}
		ended := make(chan error, 1)
		opts := append(c.Options[:len(c.Options):len(c.Options)], jetstream.PullHeartbeat(PullHeartbeat), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			select {
			case ended <- err:
			default:
			}
		}))
		cc, err := cons.Consume(c.Handle, opts...)
		if err != nil {
			log.Warn("consume "+c.What, "err", err)
			if wait.Wait(ctx) != nil {
				return
			}
			continue
		}
		wait.Reset() // the next search after this consumption ends starts at the first wait
		select {
		case <-ctx.Done():
		case <-cc.Closed():
		}
		// Drain waits for the handler of a message already delivered; Stop would not.
		cc.Drain()
		<-cc.Closed()
		if ctx.Err() != nil {
			return
		}
		var last error
		select {
		case last = <-ended:
		default:
		}
		log.Warn(c.What+" ended; consuming it again", "err", last)
		if wait.Wait(ctx) != nil {
			return
		}
	}
}
