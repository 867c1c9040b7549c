package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// deadLetters returns every letter in DEAD on subject, oldest first.
func deadLetters(t *testing.T, b *bed, subject string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, manifest.DeadStreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject == subject {
			out = append(out, m)
		}
	}
	return out
}

// awaitDead polls DEAD until subject holds n letters and returns them.
func awaitDead(t *testing.T, b *bed, subject string, n int, poll func()) []*jetstream.RawStreamMsg {
	t.Helper()
	return awaitDeadFor(t, b, subject, n, 20*time.Second, poll)
}

// awaitDeadFor is awaitDead waiting up to d.
func awaitDeadFor(t *testing.T, b *bed, subject string, n int, d time.Duration, poll func()) []*jetstream.RawStreamMsg {
	t.Helper()
	var got []*jetstream.RawStreamMsg
	retryUntil(t, d, func() error {
		if poll != nil {
			poll()
		}
		if got = deadLetters(t, b, subject); len(got) < n {
			return fmt.Errorf("%d dead letters on %s, want %d", len(got), subject, n)
		}
		return nil
	})
	return got
}

// consumerIdle fails unless the consumer has nothing pending or unacked.
func consumerIdle(t *testing.T, b *bed, stream, consumer string) {
	t.Helper()
	// Patient: it may wait for a thousand deliveries, each verified, under -race on 2 cores.
	retryUntil(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := b.js.Consumer(ctx, stream, consumer)
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		// NumRedelivered stays 1 on a stream that keeps the message: JetStream remembers that
		// it is past MaxDeliver.
		if info.NumAckPending != 0 || info.NumPending != 0 {
			return fmt.Errorf("%s > %s: %d unacked, %d pending", stream, consumer, info.NumAckPending, info.NumPending)
		}
		return nil
	})
}

// TestDead_PlainConsumer: a consumer written with plain nats.go (no sdk) that NAKs an event
// every time loses nothing: after MaxDeliver deliveries the node writes the event to DEAD
// with the original headers and its record of the death, and the consumer is done with it.
// The module itself may not write its dead subject.
func TestDead_PlainConsumer(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [bad]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.bad]\n")
	nc := b.raw(seedB, "b")
	dead := manifest.DeadSubject(manifest.EventsStreamName, "b")
	// Neither its own dead subject nor another consumer's: no module can pre-empt a letter.
	for _, dead := range []string{manifest.DeadSubject(manifest.EventsStreamName, "b"), manifest.DeadSubject(manifest.EventsStreamName, "c"),
		manifest.DeadSubject(manifest.SeatStreamName("jobs"), "seat-jobs")} {
		if !refusedPub(t, nc, dead) {
			t.Fatalf("module b published on the dead subject %s", dead)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, manifest.EventsStreamName, "b")
	if err != nil {
		t.Fatal(err)
	}
	id, err := b.client(seedA).Emit(ctx, "bad", map[string]int{"order": 7})
	if err != nil {
		t.Fatal(err)
	}
	deliveries := 0
	var seq uint64
	letters := awaitDead(t, b, dead, 1, func() {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			return
		}
		for m := range batch.Messages() {
			deliveries++
			md, _ := m.Metadata()
			seq = md.Sequence.Stream
			m.Nak()
		}
	})
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	l := letters[0]
	for h, want := range map[string]string{
		envelope.DeadReason:     "max deliveries",
		envelope.DeadDeliveries: strconv.Itoa(manifest.MaxDeliver),
		envelope.DeadConsumer:   "b",
		envelope.DeadStream:     manifest.EventsStreamName,
		envelope.DeadSubject:    manifest.EventSubject("a", "bad"),
		envelope.EventID:        id,
		envelope.Source:         "a",
		nats.MsgIdHdr:           fmt.Sprintf("dead.EVENTS.b.%d", seq),
	} {
		if got := l.Header.Get(h); got != want {
			t.Errorf("%s=%q, want %q", h, got, want)
		}
	}
	if l.Header.Get(envelope.Signature) == "" || string(l.Data) != `{"order":7}` {
		t.Errorf("original signature or body not kept: %v %s", l.Header, l.Data)
	}
	if deliveries != manifest.MaxDeliver {
		t.Errorf("delivered %d times, want %d", deliveries, manifest.MaxDeliver)
	}
	consumerIdle(t, b, manifest.EventsStreamName, "b")
	if batch, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond)); err == nil {
		for m := range batch.Messages() {
			t.Errorf("delivered again after DEAD: %s", m.Subject())
		}
	}
}

// TestDead_SdkReason: an sdk handler that always fails gives the event up with its error,
// and the node's letter carries it as x-dead-reason; the letter is the node's (its id is
// the death's, and the sdk can no longer write DEAD).
func TestDead_SdkReason(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [bad]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.bad]\n")
	cb := b.client(seedB, sdk.WithRetryBackoff(10*time.Millisecond))
	if err := cb.On("a.bad", func(context.Context, sdk.Event) error {
		return errors.New("customer 7 unknown\nsee the log")
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, err := b.client(seedA).Emit(ctx, "bad", "{}")
	if err != nil {
		t.Fatal(err)
	}
	l := awaitDead(t, b, manifest.DeadSubject(manifest.EventsStreamName, "b"), 1, nil)[0]
	if got := l.Header.Get(envelope.DeadReason); got != "customer 7 unknown see the log" {
		t.Errorf("x-dead-reason=%q", got)
	}
	if l.Header.Get(envelope.EventID) != id || l.Header.Get(envelope.DeadStream) != manifest.EventsStreamName ||
		!strings.HasPrefix(l.Header.Get(nats.MsgIdHdr), "dead.EVENTS.b.") || strings.Contains(l.Header.Get(nats.MsgIdHdr), id) {
		t.Errorf("not the node's letter: %v", l.Header)
	}
	consumerIdle(t, b, manifest.EventsStreamName, "b")
}

// TestDead_SeatJob: a seat's job its handler always fails is in DEAD after MaxDeliver
// deliveries, and gone from the seat's work queue.
func TestDead_SeatJob(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedW, _ := b.register("module: worker\nrequires: [mesh-bus]\nseats:\n  jobs: {scope: mesh, retain: 1h, accepts: [run]}\n")
	seedS, _ := b.register("module: shop\nrequires: [mesh-bus]\nuses: [jobs]\n")
	var runs atomic.Int32
	w := b.client(seedW, sdk.WithRetryBackoff(10*time.Millisecond))
	if err := w.Accept("run", func(context.Context, sdk.Job) error {
		runs.Add(1)
		return errors.New("printer on fire")
	}); err != nil {
		t.Fatal(err)
	}
	holder(t, "jobs", w)
	ids := submit(t, b.client(seedS), "jobs", "run", 1)
	stream, consumer := manifest.SeatStreamName("jobs"), manifest.SeatConsumerName("jobs", manifest.ScopeMesh, "")
	letters := awaitDead(t, b, manifest.DeadSubject(stream, consumer), 1, nil)
	l := letters[0]
	if l.Header.Get(envelope.EventID) != ids[0] || l.Header.Get(envelope.DeadSubject) != manifest.SeatAcceptSubject("jobs", "run") ||
		l.Header.Get(envelope.DeadDeliveries) != strconv.Itoa(manifest.MaxDeliver) || l.Header.Get(envelope.DeadConsumer) != consumer {
		t.Errorf("dead letter headers %v", l.Header)
	}
	retryUntil(t, 5*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := b.js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 0 {
			return fmt.Errorf("%s still holds %d jobs", stream, info.State.Msgs)
		}
		return nil
	})
	if n := runs.Load(); n != int32(manifest.MaxDeliver) {
		t.Errorf("handler ran %d times, want %d", n, manifest.MaxDeliver)
	}
}

// TestDead_Advisories: the writer stores one death once however many nodes hear it (the
// same advisory twice, as two nodes would), and refuses a +TERM naming a message outside the
// consumer's filter, which a module can send for any sequence on its own ack subject.
func TestDead_Advisories(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [x, secret]\n")
	b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.x]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ca := b.client(seedA)
	events, err := b.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	var xs []uint64 // three events the consumer delivers: three messages that can die
	for range 3 {
		if _, err := ca.Emit(ctx, "x", "{}"); err != nil {
			t.Fatal(err)
		}
		x, err := events.GetLastMsgForSubject(ctx, manifest.EventSubject("a", "x"))
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x.Sequence)
	}
	if _, err := ca.Emit(ctx, "secret", "{}"); err != nil {
		t.Fatal(err)
	}
	secret, err := events.GetLastMsgForSubject(ctx, manifest.EventSubject("a", "secret"))
	if err != nil {
		t.Fatal(err)
	}
	advise := func(subject string, a any) {
		data, _ := json.Marshal(a)
		if err := b.op.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
	}
	forged := server.JSConsumerDeliveryTerminatedAdvisory{
		TypedEvent: server.TypedEvent{Type: server.JSConsumerDeliveryTerminatedAdvisoryType, ID: "t1", Time: time.Now()},
		Stream:     manifest.EventsStreamName, Consumer: "b", StreamSeq: secret.Sequence, Deliveries: 1, Reason: "gimme",
	}
	advise(server.JSAdvisoryConsumerMsgTerminatedPre+".EVENTS.b", forged)
	death := server.JSConsumerDeliveryExceededAdvisory{
		TypedEvent: server.TypedEvent{Type: server.JSConsumerDeliveryExceededAdvisoryType, ID: "m1", Time: time.Now()},
		Stream:     manifest.EventsStreamName, Consumer: "b", StreamSeq: xs[0], Deliveries: 5,
	}
	advise(server.JSAdvisoryConsumerMaxDeliveryExceedPre+".EVENTS.b", death)
	death.ID = "m2"
	advise(server.JSAdvisoryConsumerMaxDeliveryExceedPre+".EVENTS.b", death)
	// The same message's death with another delivery count (a client's +TERM names any) is
	// the same death: no second letter.
	death.ID, death.Deliveries = "m2b", 7
	advise(server.JSAdvisoryConsumerMaxDeliveryExceedPre+".EVENTS.b", death)
	// Each kind of advisory is handled in order, so these markers, new deaths both, are
	// written only after what came before them: another message's death, and a genuine
	// +TERM with its reason.
	death.ID, death.StreamSeq, death.Deliveries = "m3", xs[1], 10
	advise(server.JSAdvisoryConsumerMaxDeliveryExceedPre+".EVENTS.b", death)
	forged.ID, forged.StreamSeq, forged.Deliveries, forged.Reason = "t2", xs[2], 3, "bad\r\nx-dead-subject: $KV.x"
	advise(server.JSAdvisoryConsumerMsgTerminatedPre+".EVENTS.b", forged)

	subject := manifest.DeadSubject(manifest.EventsStreamName, "b")
	awaitDead(t, b, subject, 3, nil)
	letters := deadLetters(t, b, subject)
	if len(letters) != 3 {
		t.Fatalf("%d dead letters, want 3 (one per death)", len(letters))
	}
	deliveries := map[string]string{}
	for i, l := range letters {
		if l.Header.Get(envelope.DeadSubject) != manifest.EventSubject("a", "x") || len(l.Header.Values(envelope.DeadSubject)) != 1 {
			t.Errorf("letter %d is of %v: a forged +TERM was dead-lettered", i, l.Header.Values(envelope.DeadSubject))
		}
		deliveries[l.Header.Get(envelope.DeadDeliveries)] = l.Header.Get(envelope.DeadReason)
	}
	want := map[string]string{"5": "max deliveries", "10": "max deliveries", "3": "bad  x-dead-subject: $KV.x"}
	if fmt.Sprint(deliveries) != fmt.Sprint(want) {
		t.Errorf("deliveries and reasons %v, want %v", deliveries, want)
	}
}

// TestDead_ForgedTermsMakeOneLetter: a consumer's client may send +TERM for a message it
// was delivered with any delivery count in the ack subject; a hundred of them for one event
// still make one dead letter, not a hundred copies of the event.
func TestDead_ForgedTermsMakeOneLetter(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [big]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.big]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := b.client(seedA).Emit(ctx, "big", map[string]string{"pad": strings.Repeat("x", 64<<10)}); err != nil {
		t.Fatal(err)
	}
	nc := b.raw(seedB, "b")
	js, _ := jetstream.New(nc)
	cons, err := js.Consumer(ctx, manifest.EventsStreamName, "b")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var reply string
	for m := range batch.Messages() {
		reply = m.Reply()
	}
	// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
	tok := strings.Split(reply, ".")
	if len(tok) < 9 {
		t.Fatalf("ack subject %q", reply)
	}
	for i := range 100 {
		tok[4] = strconv.Itoa(i + 1)
		if err := nc.Publish(strings.Join(tok, "."), []byte("+TERM forged")); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// A marker after them: another event, terminated once. The writer handles the +TERM
	// advisories in order, so once the marker's letter is in, every forged one was handled.
	if _, err := b.client(seedA).Emit(ctx, "big", map[string]string{"marker": "yes"}); err != nil {
		t.Fatal(err)
	}
	batch, err = cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		m.TermWithReason("marker")
	}
	letters := awaitDead(t, b, manifest.DeadSubject(manifest.EventsStreamName, "b"), 2, nil)
	if len(letters) != 2 {
		t.Fatalf("%d dead letters for one event terminated 100 times and a marker, want 2", len(letters))
	}
}
