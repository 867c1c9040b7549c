//go:build rabbitmq

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/manifest"
	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitMQ times n events through a RabbitMQ broker at url the way the seed's earlier design
// used it (ADR 42): persistent 256-byte messages on a durable classic queue, one publish at a
// time each confirmed by the broker before the next (publisher confirms, as sdk.Emit waits
// for the stream's ack), and a consumer on a connection of its own acking each by hand, with
// as many unacked as a module's consumer may have (MaxAckPending). The queue is removed after.
// It is behind the rabbitmq build tag: the bench needs a broker and its client only for this.
func RabbitMQ(ctx context.Context, url string, n int) (Series, error) {
	if n <= 0 {
		return Series{}, errors.New("no events to send")
	}
	pubConn, err := amqp.Dial(url)
	if err != nil {
		return Series{}, fmt.Errorf("connect to RabbitMQ at %s: %w", url, err)
	}
	defer pubConn.Close()
	subConn, err := amqp.Dial(url)
	if err != nil {
		return Series{}, fmt.Errorf("connect to RabbitMQ at %s: %w", url, err)
	}
	defer subConn.Close()
	pub, err := pubConn.Channel()
	if err != nil {
		return Series{}, err
	}
	if err := pub.Confirm(false); err != nil {
		return Series{}, fmt.Errorf("publisher confirms: %w", err)
	}
	var id [6]byte
	rand.Read(id[:])
	run := hex.EncodeToString(id[:])[:runLen]
	queue := "meshnode-bench-" + run
	if _, err := pub.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		return Series{}, fmt.Errorf("declare queue %s: %w", queue, err)
	}
	defer pub.QueueDelete(queue, false, false, false)
	sub, err := subConn.Channel()
	if err != nil {
		return Series{}, err
	}
	if err := sub.Qos(manifest.MaxAckPending, 0, false); err != nil {
		return Series{}, err
	}
	deliveries, err := sub.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return Series{}, fmt.Errorf("consume %s: %w", queue, err)
	}
	epoch := time.Now()
	r := newRecorder(run, epoch, n)
	go func() {
		for d := range deliveries {
			r.record(d.Body)
			d.Ack(false)
		}
	}()
	start := time.Since(epoch)
	for i := range n {
		pctx, cancel := context.WithTimeout(ctx, requestTimeout)
		conf, err := pub.PublishWithDeferredConfirmWithContext(pctx, "", queue, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: payload(run, i, time.Since(epoch)),
		})
		if err == nil {
			var ok bool
			if ok, err = conf.WaitContext(pctx); err == nil && !ok {
				err = errors.New("the broker refused it (nack)")
			}
		}
		cancel()
		if err != nil {
			return Series{}, fmt.Errorf("publish event %d of %d: %w", i+1, n, err)
		}
	}
	if err := r.wait(ctx, stall); err != nil {
		return Series{}, err
	}
	return r.series(start), nil
}
