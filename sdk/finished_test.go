package sdk

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// TestConsume_ACopyOfAFinishedDeliveryIsNotHandled: a handler slower than its consumer's ack
// wait gets its event delivered again while it runs (as a holder paused past the ack wait
// gets the copies together). The copy is acknowledged, not handled: the handler ran once,
// and the event after it is handled as usual. A run of the TestChaos bed saw a seat job
// handled twice by one holder, both at the instant its paused node resumed.
func TestConsume_ACopyOfAFinishedDeliveryIsNotHandled(t *testing.T) {
	_, nc, _ := eventsServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	const ackWait = 200 * time.Millisecond
	cons, err := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{Durable: "a",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: manifest.MaxAckPending})
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	c := &Client{nc: nc, js: js, log: slog.New(slog.DiscardHandler), signersKnown: time.Now(),
		self: api.WhoamiReply{Module: "a", Signers: api.Signers{api.SignerKey(api.SignerModule, "a"): pub}}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	defer c.cancel()

	var mu sync.Mutex
	calls := map[string]int{}
	second := make(chan struct{})
	handler := func(_ context.Context, e Event) error {
		mu.Lock()
		calls[e.ID]++
		first, next := len(calls) == 1 && calls[e.ID] == 1, len(calls) == 2 && calls[e.ID] == 1
		mu.Unlock()
		if first {
			time.Sleep(3 * ackWait) // a span past the ack wait, not a wait for a state
		}
		if next {
			close(second)
		}
		return nil
	}
	d := &dispatcher{c: c, stream: "EVENTS", consumer: "a", maxDeliver: manifest.MaxDeliver,
		route: func(string) Handler { return handler }}
	k := c.startConsuming(cons, d, "test")
	defer k.Stop()

	subject := manifest.EventSubject("a", "x")
	publish := func(n int) string {
		body := fmt.Appendf(nil, `{"n":%d}`, n)
		h, err := envelope.Stamp(kp, "a", "n", subject, body, envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: body}); err != nil {
			t.Fatal(err)
		}
		return h.Get(envelope.EventID)
	}
	first := publish(1)
	testbed.RetryUntil(t, 10*time.Second, func() error {
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.AckFloor.Stream < 1 {
			return fmt.Errorf("the first event is not acked yet (delivered %d times)", info.Delivered.Consumer)
		}
		if info.Delivered.Consumer < 2 {
			return fmt.Errorf("acked after %d deliveries: the bed delivered no copy", info.Delivered.Consumer)
		}
		return nil
	})
	publish(2) // queued behind every copy of the first
	select {
	case <-second:
	case <-ctx.Done():
		t.Fatal("the second event was not handled")
	}
	mu.Lock()
	defer mu.Unlock()
	if calls[first] != 1 {
		t.Fatalf("the first event was handled %d times, want once: its copies were handled again", calls[first])
	}
}
