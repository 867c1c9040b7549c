package sdk

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/internal/jsconsume"
	"github.com/meshnode/meshnode/manifest"
)

// consumption consumes one of the module's durable consumers until stopped, and again after
// the node makes it anew: nats.go ends a Consume whose consumer or stream was deleted, and
// drift repair recreates them under a running module, which must not stay deaf.
type consumption struct {
	stop context.CancelFunc
	done chan struct{} // closed when the consumption has ended
}

// resumeRetry is how soon a consumption looks for its consumer again: drift repair makes it
// within a second or two, and the module should be consuming again within 5 s.
var resumeRetry = backoff.Backoff{First: 100 * time.Millisecond, Max: time.Second}

// startConsuming starts consuming cons, found already (so that a refusal is the caller's error), as
// d's; what names it in the log.
func (c *Client) startConsuming(cons jetstream.Consumer, d *dispatcher, what string) *consumption {
	ctx, stop := context.WithCancel(c.ctx)
	k := &consumption{stop: stop, done: make(chan struct{})}
	first := cons
	c.consuming.Add(1)
	go func() {
		defer c.consuming.Done()
		defer close(k.done)
		jsconsume.Run(ctx, jsconsume.Consumer{
			What: what,
			Get: func(ctx context.Context) (jetstream.Consumer, error) {
				if first != nil {
					cons, first = first, nil
					return cons, nil
				}
				return c.js.Consumer(ctx, d.stream, d.consumer)
			},
			Handle:  d.handle,
			Options: []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(manifest.MaxAckPending)},
			Log:     c.log,
			Retry:   resumeRetry,
		})
	}()
	return k
}

// Stop ends the consumption; a handler already running finishes on its own.
func (k *consumption) Stop() { k.stop() }
