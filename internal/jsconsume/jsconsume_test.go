package jsconsume_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/meshnode/meshnode/internal/jsconsume"
	"github.com/meshnode/meshnode/internal/testbed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun_ConsumesAgainAfterTheConsumerIsDeleted: a deleted consumer (drift repair makes it
// again) ends a consumption on its own; Run finds the consumer again and goes on, so the part
// is not left deaf; it returns once its context ends, with no handler running.
func TestRun_ConsumesAgainAfterTheConsumerIsDeleted(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy}
	var got, after, gets atomic.Int64
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		jsconsume.Run(runCtx, jsconsume.Consumer{
			What: "the test's consumer",
			Get: func(ctx context.Context) (jetstream.Consumer, error) {
				gets.Add(1)
				return js.CreateOrUpdateConsumer(ctx, "S", cfg)
			},
			Handle: func(m jetstream.Msg) {
				if got.Add(1); m.Subject() == "s.after" {
					after.Add(1)
				}
				m.Ack()
			},
		})
	}()
	publish := func(subject string, n int) {
		for i := range n {
			if _, err := js.Publish(ctx, subject, []byte(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("s.before", 3)
	testbed.RetryUntil(t, 10*time.Second, func() error {
		if n := got.Load(); n != 3 {
			return fmt.Errorf("handled %d of 3", n)
		}
		return nil
	})
	if err := js.DeleteConsumer(ctx, "S", "d"); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, 10*time.Second, func() error {
		if n := gets.Load(); n < 2 {
			return fmt.Errorf("the consumer was looked up %d times: the deletion did not end the consumption", n)
		}
		return nil
	})
	publish("s.after", 2)
	testbed.RetryUntil(t, 10*time.Second, func() error {
		if n := after.Load(); n != 2 {
			return fmt.Errorf("handled %d of the 2 published after the consumer was made again", n)
		}
		return nil
	})
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// TestRun_WaitsForAConsumerThatIsNotThereYet: a consumer that cannot be found yet is asked for
// again until it is; a Run whose context ends while waiting returns.
func TestRun_WaitsForAConsumerThatIsNotThereYet(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got atomic.Int64
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		jsconsume.Run(runCtx, jsconsume.Consumer{
			What:   "a consumer made later",
			Get:    func(ctx context.Context) (jetstream.Consumer, error) { return js.Consumer(ctx, "L", "d") },
			Handle: func(m jetstream.Msg) { got.Add(1); m.Ack() },
		})
	}()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "L", Subjects: []string{"l.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, "L", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "l.x", nil); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, 10*time.Second, func() error {
		if got.Load() != 1 {
			return fmt.Errorf("not handled yet")
		}
		return nil
	})
	stop()
	<-done
}
