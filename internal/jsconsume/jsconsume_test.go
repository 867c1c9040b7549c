package jsconsume_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
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

// TestRun_PullsAgainSoonAfterAPullIsLost: a pull can go nowhere — sent while a clustered
// consumer elects a leader, or to a leader killed or cut off right after — and nobody tells the
// client. nats.go notices only by missed heartbeats, by default half its 30 s expiry twice over:
// in issue 38's chaos run a seat's holder kept its lease for 25 s after a kill of two servers,
// its queue growing to 101 jobs with no pull waiting (num_waiting 0). Run's pulls notice a lost
// pull within a few seconds and pull again.
func TestRun_PullsAgainSoonAfterAPullIsLost(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, admin := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	// The consuming client talks to the server through a proxy that loses its pulls while
	// told to.
	p := testbed.NewPullLoser(t, srv.Addr().String())
	nc, err := nats.Connect("nats://" + p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var got, after atomic.Int64
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		jsconsume.Run(runCtx, jsconsume.Consumer{
			What:    "the consumer",
			Get:     func(ctx context.Context) (jetstream.Consumer, error) { return js.Consumer(ctx, "S", "d") },
			Options: []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(2)},
			Handle: func(m jetstream.Msg) {
				if got.Add(1); m.Subject() == "s.after" {
					after.Add(1)
				}
				m.Ack()
			},
		})
	}()
	defer func() {
		stop()
		<-done
	}()
	testbed.RetryUntil(t, 10*time.Second, func() error {
		if info, err := admin.Consumer(ctx, "S", "d"); err != nil || info.CachedInfo().NumWaiting == 0 {
			return errors.New("the consumer's client has not pulled yet")
		}
		return nil
	})
	// The pull waiting takes two; every pull sent meanwhile is lost.
	p.Lose(true)
	for range 2 {
		if _, err := admin.Publish(ctx, "s.before", nil); err != nil {
			t.Fatal(err)
		}
	}
	testbed.RetryUntil(t, 10*time.Second, func() error {
		if n := got.Load(); n != 2 {
			return fmt.Errorf("handled %d of 2", n)
		}
		if p.Lost() == 0 {
			return errors.New("the client has not pulled again yet")
		}
		return nil
	})
	p.Lose(false)
	if _, err := admin.Publish(ctx, "s.after", nil); err != nil {
		t.Fatal(err)
	}
	// Well within nats.go's default 30 s; the bound leaves a loaded machine its slack.
	testbed.RetryUntil(t, 12*time.Second, func() error {
		if after.Load() == 0 {
			return fmt.Errorf("nothing published after the pulls were lost was handled (%d lost): no pull is waiting", p.Lost())
		}
		return nil
	})
}
