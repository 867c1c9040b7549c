package sdk

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// TestEmit_SendsAgainWhenNoAckComes: against a real JetStream stream with its duplicate window,
// an admitter that loses the first send (the event never stored) or the first ack (the event
// stored, its ack gone) costs Emit one short wait: it sends the same event again, returns its
// id without error, and the stream holds the event once. A send answered "duplicate message
// id is in process" (a clustered stream still storing the lost ack's copy) is sent again.
func TestEmit_SendsAgainWhenNoAckComes(t *testing.T) {
	for _, lose := range []string{"send", "ack", "ack, then in process"} {
		t.Run(lose, func(t *testing.T) {
			srv, nc, stream := eventsServer(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// The admitter: passes on each send with its reply, but the first it drops (lose
			// "send") or passes on with its ack sent nowhere the module listens (lose "ack").
			admitter, err := nats.Connect(srv.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer admitter.Close()
			var sends atomic.Int64
			prefix := manifest.AdmitSubject("a", "")
			if _, err := admitter.Subscribe(prefix+">", func(m *nats.Msg) {
				reply := m.Reply
				switch n := sends.Add(1); {
				case n == 1 && lose == "send":
					return
				case n == 1:
					reply = "lost.ack"
				case n == 2 && lose == "ack, then in process":
					m.Respond([]byte(`{"error":{"code":409,"err_code":10158,"description":"duplicate message id is in process"}}`))
					return
				}
				admitter.PublishMsg(&nats.Msg{Subject: strings.TrimPrefix(m.Subject, prefix), Reply: reply, Header: m.Header, Data: m.Data})
			}); err != nil {
				t.Fatal(err)
			}
			admitter.Flush()

			c := bareClient(t, nc, "a", "x")
			c.firstAckWait = 300 * time.Millisecond

			began := time.Now()
			id, err := c.Emit(ctx, "x", map[string]int{"n": 1})
			if err != nil {
				t.Fatalf("Emit with its first %s lost: %v", lose, err)
			}
			if took := time.Since(began); took > 10*time.Second {
				t.Errorf("Emit took %v: it waited for more than one lost ack", took)
			}
			want := int64(2) // the lost one and one more
			if lose == "ack, then in process" {
				want = 3
			}
			if n := sends.Load(); n != want {
				t.Errorf("the admitter heard %d sends, want %d", n, want)
			}
			info, err := stream.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != 1 {
				t.Fatalf("the stream holds %d events, want the event once", info.State.Msgs)
			}
			stored, err := stream.GetMsg(ctx, info.State.LastSeq)
			if err != nil {
				t.Fatal(err)
			}
			if got := stored.Header.Get(envelope.EventID); got != id {
				t.Errorf("the stream holds event %q, Emit returned %q", got, id)
			}
		})
	}
}

// TestEmit_WaitsOutAnAdmitterAway: an event sent while no admitter hears the module's prefix
// (the server cut it off for falling behind a burst, and it is connecting again) is sent again
// until one is back, by Emit and by EmitAsync alike, and stored.
func TestEmit_WaitsOutAnAdmitterAway(t *testing.T) {
	srv, nc, stream := eventsServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := bareClient(t, nc, "a", "x")
	emitted := make(chan error, 1)
	go func() {
		_, err := c.Emit(ctx, "x", map[string]int{"n": 1})
		emitted <- err
	}()
	pending, err := c.EmitAsync(ctx, "x", map[string]int{"n": 2})
	if err != nil {
		t.Fatal(err)
	}
	// Away for a second: longer than nats.go's own retries of a no-responders (two, 250 ms
	// apart) wait.
	time.Sleep(time.Second)
	admitter, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admitter.Close()
	prefix := manifest.AdmitSubject("a", "")
	if _, err := admitter.Subscribe(prefix+">", func(m *nats.Msg) {
		admitter.PublishMsg(&nats.Msg{Subject: strings.TrimPrefix(m.Subject, prefix), Reply: m.Reply, Header: m.Header, Data: m.Data})
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-emitted; err != nil {
		t.Errorf("Emit while the admitter was away: %v", err)
	}
	if err := pending.Wait(ctx); err != nil {
		t.Errorf("EmitAsync while the admitter was away: %v", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("the stream holds %d events, want both", info.State.Msgs)
	}
}

// eventsServer is a real nats-server with JetStream, a connection to it, and a stream EVENTS
// of module a's events with the mesh's duplicate window.
func eventsServer(t *testing.T) (*server.Server, *nats.Conn, jetstream.Stream) {
	t.Helper()
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"mesh.mod.a.event.>"},
		Duplicates: manifest.DefaultDuplicateWindow})
	if err != nil {
		t.Fatal(err)
	}
	return srv, nc, stream
}

// TestEmit_AdmitterNeverBack: an event nothing ever answers (no admitter, no stream: a node
// that is down) is sent again with a back-off for admitterAwayFor — fewer than one send each
// 100 ms, not a module's flood — and then Emit and EmitAsync both report ErrNoQueue: not a lost
// ack that "may have been stored", and not only when the caller's context ends.
func TestEmit_AdmitterNeverBack(t *testing.T) {
	srv := testbed.NATSServer(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := bareClient(t, nc, "a", "x")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sent := func() int64 { // what the server took from clients: the sends, nothing else runs
		v, err := srv.Varz(nil)
		if err != nil {
			t.Fatal(err)
		}
		return v.InMsgs
	}
	for _, how := range []string{"Emit", "EmitAsync"} {
		before, began := sent(), time.Now()
		if how == "Emit" {
			_, err = c.Emit(ctx, "x", map[string]int{"n": 1})
		} else {
			var p *Pending
			if p, err = c.EmitAsync(ctx, "x", map[string]int{"n": 2}); err == nil {
				err = p.Wait(ctx)
			}
		}
		took := time.Since(began)
		if !errors.Is(err, ErrNoQueue) {
			t.Fatalf("%s with nothing answering: %v, want ErrNoQueue", how, err)
		}
		if took < admitterAwayFor || took > admitterAwayFor+3*time.Second {
			t.Errorf("%s gave up after %v, want about %v", how, took, admitterAwayFor)
		}
		if n := sent() - before; n < 5 || n >= int64(admitterAwayFor/(100*time.Millisecond)) {
			t.Errorf("%s sent the event %d times in %v, want it sent again with a back-off", how, n, took)
		} else {
			t.Logf("%s: sent %d times, ErrNoQueue after %v", how, n, took.Round(time.Millisecond))
		}
	}
	// A caller that gives up meanwhile is told so: its context's error is in the error.
	short, stop := context.WithCancel(ctx)
	time.AfterFunc(300*time.Millisecond, stop)
	if _, err := c.Emit(short, "x", map[string]int{"n": 3}); !errors.Is(err, ErrNoQueue) || !errors.Is(err, context.Canceled) {
		t.Errorf("Emit cancelled while nothing answered: %v, want ErrNoQueue and context.Canceled", err)
	}
}

// bareClient is a Client of module on nc, declaring the events emits, as Connect makes one but
// without a node to ask: a key of its own, its connection's context live until the test ends.
func bareClient(t *testing.T, nc *nats.Conn, module string, emits ...string) *Client {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	key, err := envelope.NewSigningKey(kp)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{nc: nc, js: js, key: key, log: slog.New(slog.DiscardHandler), refusals: NewRefusals("_INBOX"),
		self: api.WhoamiReply{Module: module, Node: "n", Emits: emits}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	t.Cleanup(c.cancel)
	c.connCtx, c.connEnd = context.WithCancel(c.ctx)
	return c
}
