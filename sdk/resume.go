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
// d's; what names it in the log. Deliveries are queued as they arrive and handled in order by
// one goroutine, which takes every delivery queued at once (up to MaxAckPending) and verifies
// their signatures together before it checks and handles each (verifyAhead).
func (c *Client) startConsuming(cons jetstream.Consumer, d *dispatcher, what string) *consumption {
	ctx, stop := context.WithCancel(c.ctx)
	k := &consumption{stop: stop, done: make(chan struct{})}
	first := cons
	queue := make(chan jetstream.Msg, manifest.MaxAckPending)
	c.consuming.Add(1)
	go func() {
		defer c.consuming.Done()
		defer close(k.done)
		handled := make(chan struct{})
		go func() {
			defer close(handled)
			d.run(ctx, queue)
		}()
		jsconsume.Run(ctx, jsconsume.Consumer{
			What: what,
			Get: func(ctx context.Context) (jetstream.Consumer, error) {
				if first != nil {
					cons, first = first, nil
					return cons, nil
				}
				return c.js.Consumer(ctx, d.stream, d.consumer)
			},
			// A delivery queued when the consumption ends is not handled: unacked, it is
			// delivered again after the consumer's ack wait, as one nats.go had fetched is.
			Handle: func(m jetstream.Msg) {
				select {
				case queue <- m:
				case <-ctx.Done():
				}
			},
			Options: []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(manifest.MaxAckPending)},
			Log:     c.log,
			Retry:   resumeRetry,
		})
		<-handled
	}()
	return k
}

// run handles the deliveries queued, in order, until ctx ends: each time, every delivery
// queued at once, their signatures verified together.
func (d *dispatcher) run(ctx context.Context, queue <-chan jetstream.Msg) {
	batch := make([]jetstream.Msg, 0, manifest.MaxAckPending)
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-queue:
			batch = append(batch[:0], m)
		}
	more:
		for len(batch) < cap(batch) {
			select {
			case m := <-queue:
				batch = append(batch, m)
			default:
				break more
			}
		}
		pre := d.c.verifyAhead(batch)
		for i, m := range batch {
			if ctx.Err() != nil {
				return
			}
			d.handle(m, pre[i])
		}
	}
}

// Stop ends the consumption; a handler already running finishes on its own.
func (k *consumption) Stop() { k.stop() }
