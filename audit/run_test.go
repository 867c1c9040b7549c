package audit

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// runBed is a logger running on a real nats-server: EVENTS, the audit consumer as the node
// makes it (ack all), and the log's messages. The test's own connection (nc, js, cons) talks
// to the server directly.
type runBed struct {
	l    *Logger
	nc   *nats.Conn
	js   jetstream.JetStream
	cons jetstream.Consumer
	logs *testbed.SyncBuffer
	// loser is the proxy the logger's connection goes through, with newLosingRunBed; nil
	// when the logger shares the test's connection.
	loser *testbed.PullLoser
}

func newRunBed(t *testing.T) *runBed {
	t.Helper()
	return newBed(t, false)
}

// newLosingRunBed is a runBed whose logger talks to the server through a PullLoser.
func newLosingRunBed(t *testing.T) *runBed {
	t.Helper()
	return newBed(t, true)
}

func newBed(t *testing.T, losing bool) *runBed {
	t.Helper()
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	nc, js := testbed.Connect(t, srv)
	logJS := js
	var loser *testbed.PullLoser
	if losing {
		loser = testbed.NewPullLoser(t, srv.Addr().String())
		lnc, err := nats.Connect("nats://" + loser.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(lnc.Close)
		if logJS, err = jetstream.New(lnc); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev := manifest.EventsStream()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: ev.Name, Subjects: ev.Subjects, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	ac := manifest.AuditConsumer("n")
	cons, err := js.CreateConsumer(ctx, ac.Stream, jetstream.ConsumerConfig{
		Durable: ac.Name, AckPolicy: jetstream.AckAllPolicy, AckWait: manifest.AuditAckWait,
		MaxAckPending: ac.MaxAckPending, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(t.TempDir(), "audit.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	logs := &testbed.SyncBuffer{}
	l, err := New(db, logJS, "n", func(_, source string, _ uint64, _ time.Time) (string, bool) { return pub, source == "m" },
		func(_, source string) bool { return source == "m" }, 0, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return &runBed{l: l, nc: nc, js: js, cons: cons, logs: logs, loser: loser}
}

// start runs the logger until the test ends.
func (b *runBed) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// publish publishes n events of module m and returns the last stream sequence.
func (b *runBed) publish(t *testing.T, n int) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last uint64
	for i := range n {
		msg := nats.NewMsg(manifest.EventSubject("m", "tick"))
		msg.Header.Set("x-event-id", fmt.Sprintf("e-%d-%d", time.Now().UnixNano(), i))
		msg.Header.Set("x-source", "m")
		msg.Data = []byte(`{}`)
		ack, err := b.js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	return last
}

// caughtUp waits until the log holds want records and the consumer's acks reach last, with
// nothing pending.
func (b *runBed) caughtUp(t *testing.T, want, last uint64) {
	t.Helper()
	testbed.RetryUntil(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := b.cons.Info(ctx)
		if err != nil {
			return err
		}
		if got := b.l.Records(); got != want || info.AckFloor.Stream != last || info.NumAckPending != 0 {
			return fmt.Errorf("%d records of %d; acked to %d of %d, %d pending", got, want, info.AckFloor.Stream, last, info.NumAckPending)
		}
		return nil
	})
}

// TestLogger_RunAcksOncePerBatch: 3,000 events reach the log and the consumer's ack floor
// reaches the last of them, with an ack a batch, not an ack an event.
func TestLogger_RunAcksOncePerBatch(t *testing.T) {
	b := newRunBed(t)
	var acks atomic.Int64
	sub, err := b.nc.Subscribe("$JS.ACK."+manifest.EventsStreamName+"."+b.l.ConsumerName()+".>", func(*nats.Msg) { acks.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	b.start(t)
	const n = 3000
	last := b.publish(t, n)
	b.caughtUp(t, n, last)
	if got := acks.Load(); got == 0 || got > n/10 {
		t.Fatalf("%d acks for %d events: want one a batch", got, n)
	}
	t.Logf("%d acks for %d events", acks.Load(), n)
}

// TestLogger_RunReadsAgainAfterAMissingDelivery: another client pulls from the audit
// consumer while the log reads and acks nothing it takes, so deliveries of the log's run go
// to it. Acking all past such a hole would drop those events; the log stops acking at the
// hole, starts a new run from the ack floor, and records every event once.
func TestLogger_RunReadsAgainAfterAMissingDelivery(t *testing.T) {
	b := newRunBed(t)
	b.start(t)
	first := b.publish(t, 5)
	b.caughtUp(t, 5, first)
	var stolen int
	var last uint64
	published := uint64(5)
	testbed.RetryUntil(t, 30*time.Second, func() error {
		// The server hands deliveries round the waiting pulls in turn: with this one
		// waiting behind the log's, some of the next events come here.
		batch, err := b.cons.Fetch(5, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		last = b.publish(t, 20)
		published += 20
		for range batch.Messages() {
			stolen++
		}
		if stolen == 0 {
			return fmt.Errorf("no delivery came to the other client")
		}
		return nil
	})
	b.caughtUp(t, published, last)
	if !strings.Contains(b.logs.String(), "went missing") {
		t.Fatalf("%d deliveries went to another client and the log did not see the hole; its log:\n%s", stolen, b.logs)
	}
	t.Logf("%d deliveries went to another client", stolen)
}

// TestLogger_RunPullsAgainSoonAfterAPullIsLost: a pull can go nowhere — sent while the
// clustered audit consumer elects a leader, or waiting at a leader killed or cut off — and
// nobody tells the logger. nats.go notices only by missed heartbeats, by default half its 30 s
// expiry twice over, and the log stood still behind EVENTS meanwhile; the logger's pulls
// notice within a few seconds (jsconsume.PullHeartbeat) and pull again.
func TestLogger_RunPullsAgainSoonAfterAPullIsLost(t *testing.T) {
	b := newLosingRunBed(t)
	b.start(t)
	testbed.RetryUntil(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if info, err := b.cons.Info(ctx); err != nil || info.NumWaiting == 0 {
			return fmt.Errorf("the logger has not pulled yet (err %v)", err)
		}
		return nil
	})
	// The pull waiting takes batchSize events; every pull the logger sends meanwhile (nats.go
	// tops up at half of it) is lost.
	b.loser.Lose(true)
	b.publish(t, batchSize)
	testbed.RetryUntil(t, 30*time.Second, func() error {
		if got := b.l.Records(); got != batchSize {
			return fmt.Errorf("%d records of %d", got, batchSize)
		}
		if b.loser.Lost() == 0 {
			return fmt.Errorf("the logger has not pulled again yet")
		}
		return nil
	})
	b.loser.Lose(false)
	b.publish(t, 1)
	// Well within nats.go's default 30 s; the bound leaves a loaded machine its slack.
	testbed.RetryUntil(t, 12*time.Second, func() error {
		if got := b.l.Records(); got != batchSize+1 {
			return fmt.Errorf("the event published after the pulls were lost is not recorded (%d records, %d pulls lost): no pull is waiting", got, b.loser.Lost())
		}
		return nil
	})
}
