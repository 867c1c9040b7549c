package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// TestTopology_SeatQueueShrinksInPlace is issue 37's migration of a seat's queue: a SEAT_
// stream made with the old fixed reservation (350 MiB, a sixty-fourth of a 57 GiB store's
// room) and holding jobs is resized by the next reconcile to what the seat declares now —
// here to 1 MiB, below what it holds. JetStream keeps every queued job (a DiscardNew stream's
// limit is not enforced on what is stored), refuses new jobs while it is over, and takes
// them again once the holder has taken enough.
func TestTopology_SeatQueueShrinksInPlace(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: 2 << 30})
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := seatModule(t, "mailer", "")
	seat := d.Seats[0]

	before := &Topology{js: js, node: "alpha", replicas: func() int { return 1 }, budget: Budget{Store: 2 << 30, Seat: 350 << 20}}
	if err := before.EnsureModule(ctx, d); err != nil {
		t.Fatal(err)
	}
	const jobs = 3
	job := strings.Repeat("x", 512<<10)
	for i := range jobs {
		if _, err := js.Publish(ctx, seat.Accepts[0].Subject, []byte(fmt.Sprint(i, job))); err != nil {
			t.Fatalf("queue job %d: %v", i, err)
		}
	}

	after := &Topology{js: js, node: "alpha", replicas: func() int { return 1 }, budget: Budget{Store: 2 << 30, Seat: 1 << 20}}
	if err := after.EnsureModule(ctx, d); err != nil {
		t.Fatalf("reconcile the seat's queue to 1MiB: %v", err)
	}
	stream, err := js.Stream(ctx, seat.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := info.Config.MaxBytes, int64(1<<20); got != want {
		t.Errorf("%s MaxBytes after the reconcile = %d, want %d", seat.Stream.Name, got, want)
	}
	if got := info.State.Msgs; got != jobs {
		t.Fatalf("%s holds %d jobs after shrinking below its use, want all %d", seat.Stream.Name, got, jobs)
	}
	if _, err := js.Publish(ctx, seat.Accepts[0].Subject, []byte("one more")); err == nil || !strings.Contains(err.Error(), "maximum bytes") {
		t.Errorf("%s over its new limit (%d bytes held): a new job got %v, want JetStream's maximum-bytes refusal", seat.Stream.Name, info.State.Bytes, err)
	}

	// The holder takes every job, in order, and the queue takes new ones again.
	c, ok, err := d.SeatConsumer(seat.Name, "alpha")
	if err != nil || !ok {
		t.Fatalf("seat consumer: %v, %v", ok, err)
	}
	cons, err := js.Consumer(ctx, c.Stream, c.Name)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(jobs, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	for m := range batch.Messages() {
		if want := fmt.Sprint(i); !strings.HasPrefix(string(m.Data()), want+"x") {
			t.Errorf("job %d is %.8q…, want the job queued %d", i, m.Data(), i)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		i++
	}
	if i != jobs {
		t.Fatalf("the holder got %d jobs, want %d: %v", i, jobs, batch.Error())
	}
	testbed.RetryUntil(t, 10*time.Second, func() error {
		_, err := js.Publish(ctx, seat.Accepts[0].Subject, []byte("after the backlog"))
		return err
	})
}

// lookupTimesOutOnce is a JetStream whose first consumer lookup times out, as a node's first
// attempts did while its streams caught up after a restart.
type lookupTimesOutOnce struct {
	jetstream.JetStream
	timedOut bool
}

func (j *lookupTimesOutOnce) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	if !j.timedOut {
		j.timedOut = true
		return nil, context.DeadlineExceeded
	}
	return j.JetStream.Consumer(ctx, stream, name)
}

// TestTopology_RemadeConsumerSurvivesARestartsSlowLookup: a module's EVENTS consumer made
// again after its ack floor (drift) starts by sequence; the next start's reconcile asks for
// DeliverNew, is refused ("deliver policy can not be updated"), and looks the consumer up to
// keep its start. In the fault harness that lookup timed out on a node restarted after a full
// disk, the refusal was returned as final, and the node exited. The lookup's timeout must
// make the step be tried again, and the consumer keep where it starts.
func TestTopology_RemadeConsumerSurvivesARestartsSlowLookup(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := shopConsumesItself(t)
	before := &Topology{js: js, node: "alpha", replicas: func() int { return 1 }}
	if err := before.EnsureMesh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, d.Emits[0].Subject, []byte("before it consumes")); err != nil {
		t.Fatal(err)
	}
	if err := before.EnsureModule(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, err := before.EventsConsumers(ctx); err != nil { // the drift check notes its floor
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, manifest.EventsStreamName, "shop"); err != nil {
		t.Fatal(err)
	}
	if err := before.RepairModule(ctx, d); err != nil {
		t.Fatal(err)
	}

	slow := &lookupTimesOutOnce{JetStream: js}
	restarted := &Topology{js: slow, node: "alpha", replicas: func() int { return 1 }}
	if err := jsretry.Request(ctx, func(ctx context.Context) error { return restarted.EnsureModule(ctx, d) }); err != nil {
		t.Fatalf("the restarted node's reconcile, its first lookup timing out: %v", err)
	}
	if !slow.timedOut {
		t.Fatal("the reconcile never looked the consumer up: the refusal this test is about did not happen")
	}
	cons, err := js.Consumer(ctx, manifest.EventsStreamName, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if got := cons.CachedInfo().Config.DeliverPolicy; got != jetstream.DeliverByStartSequencePolicy {
		t.Errorf("the remade consumer's deliver policy after the restart = %v, want by start sequence", got)
	}
}

// TestTopology_RemadeTwiceKeepsItsFloor is the Node.js module's stall in the 30-minute fault
// run: its consumer deleted three times in 15 s. Made again after its ack floor, a clustered
// consumer reports an ack floor of 0 until it writes its first state, so the floor noted from
// it was 0; deleted again, it was made from the stream's first event, and the module spent the
// rest of the run handling everything it had handled before. Made again twice, it must still
// start after what the module had acked.
func TestTopology_RemadeTwiceKeepsItsFloor(t *testing.T) {
	servers := testbed.JetStreamCluster(t, 3)
	_, js := testbed.Connect(t, servers[0])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := shopConsumesItself(t)
	topo := &Topology{js: js, node: "alpha", replicas: func() int { return 3 }}
	if err := jsretry.Request(ctx, topo.EnsureMesh); err != nil {
		t.Fatal(err)
	}
	if err := topo.EnsureModule(ctx, d); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for n := range 5 {
		ack, err := js.Publish(ctx, d.Emits[0].Subject, []byte(fmt.Sprint(n)))
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	cons, err := js.Consumer(ctx, manifest.EventsStreamName, "shop")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(3)
	if err != nil {
		t.Fatal(err)
	}
	var acked uint64
	for msg := range batch.Messages() {
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		meta, _ := msg.Metadata()
		acked = meta.Sequence.Stream
	}
	if acked != last-2 {
		t.Fatalf("acked up to %d, want %d (3 of 5 events ending at %d)", acked, last-2, last)
	}
	testbed.RetryUntil(t, 10*time.Second, func() error {
		if _, err := topo.EventsConsumers(ctx); err != nil {
			return err
		}
		if at, _ := topo.floors.get("shop"); at != acked {
			return fmt.Errorf("the drift check noted a floor of %d, want %d", at, acked)
		}
		return nil
	})
	for round := 1; round <= 2; round++ {
		if err := js.DeleteConsumer(ctx, manifest.EventsStreamName, "shop"); err != nil {
			t.Fatal(err)
		}
		if err := topo.RepairModule(ctx, d); err != nil {
			t.Fatalf("made again, round %d: %v", round, err)
		}
		cons, err := js.Consumer(ctx, manifest.EventsStreamName, "shop")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := topo.EventsConsumers(ctx); err != nil { // the drift check lists it, unacked
			t.Fatal(err)
		}
		cfg := cons.CachedInfo().Config
		if cfg.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || cfg.OptStartSeq != acked+1 {
			t.Fatalf("made again, round %d: starts %v at %d, want by start sequence at %d (after the module's ack floor)",
				round, cfg.DeliverPolicy, cfg.OptStartSeq, acked+1)
		}
	}
}

// shopConsumesItself is module shop, which emits sold and consumes it.
func shopConsumesItself(t testing.TB) *manifest.Derivation {
	t.Helper()
	m, err := manifest.Parse([]byte("module: shop\nrequires: [mesh-bus]\nemits: [sold]\nconsumes: [shop.sold]\n"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.Derive()
	if err != nil {
		t.Fatal(err)
	}
	return d
}
