package node_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCheck_ForgedEventsNeverReachHandlers: events the bus lets a module publish on its own
// subject but whose envelope does not prove their source — a bad signature, an x-source
// that is not the subject's module, an x-time an hour from when the stream stored it, an
// x-event-id that is not a UUIDv7, no x-node — are never handed to an sdk handler: each is in
// DEAD with the check's reason. The genuine events around them are handled, including one
// from a module registered after the consumer connected (its key is asked for then).
func TestCheck_ForgedEventsNeverReachHandlers(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [x]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [\"*.x\"]\n")
	var mu sync.Mutex
	var handled []string
	cb := b.client(seedB)
	if err := cb.On("*.x", func(_ context.Context, e sdk.Event) error {
		mu.Lock()
		handled = append(handled, e.Source+" "+string(e.Data))
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := mustKey(t, seedA)
	js, _ := jetstream.New(b.raw(seedA, "a"))
	subject := manifest.EventSubject("a", "x")
	// stamp signs an envelope by hand, with what a forger chooses.
	stamp := func(id, source string, at time.Time, body string) nats.Header {
		ts := at.UTC().Format(time.RFC3339Nano)
		sig, err := key.Sign(envelope.SigningInput(id, ts, subject, source, []byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		h := nats.Header{}
		h.Set(envelope.EventID, id)
		h.Set(envelope.Source, source)
		h.Set(envelope.Node, "alpha")
		h.Set(envelope.Time, ts)
		h.Set(envelope.ContentType, envelope.JSON)
		h.Set(envelope.Signature, base64.RawURLEncoding.EncodeToString(sig))
		return h
	}
	newID := func() string { return uuid.Must(uuid.NewV7()).String() }
	forged := map[string]nats.Header{}
	tampered := stamp(newID(), "a", time.Now(), `{"n":1}`)
	forged[`{"n":1,"tampered":true}`] = tampered
	forged[`{"n":2}`] = stamp(newID(), "c", time.Now(), `{"n":2}`)
	forged[`{"n":3}`] = stamp(newID(), "a", time.Now().Add(-time.Hour), `{"n":3}`)
	forged[`{"n":4}`] = stamp("12345", "a", time.Now(), `{"n":4}`)
	noNode := stamp(newID(), "a", time.Now(), `{"n":5}`)
	noNode.Del(envelope.Node)
	forged[`{"n":5}`] = noNode
	reasons := map[string]string{
		`{"n":1,"tampered":true}`: "signature",
		`{"n":2}`:                 `x-source "c" does not own`,
		`{"n":3}`:                 "outside the replay window",
		`{"n":4}`:                 "UUIDv7",
		`{"n":5}`:                 "missing envelope header x-node",
	}
	ca := b.client(seedA)
	if _, err := ca.Emit(ctx, "x", `{"genuine":1}`); err != nil {
		t.Fatal(err)
	}
	for body, h := range forged {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("a", subject), Header: h, Data: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	// A module registered after b connected: b learns its key when its first event comes.
	seedD, _ := b.register("module: d\nrequires: [mesh-bus]\nemits: [x]\n")
	if _, err := b.client(seedD).Emit(ctx, "x", `{"genuine":2}`); err != nil {
		t.Fatal(err)
	}

	letters := awaitDead(t, b, manifest.DeadSubject(manifest.EventsStreamName, "b"), len(forged), nil)
	for _, l := range letters {
		want, ok := reasons[string(l.Data)]
		if !ok {
			t.Errorf("dead letter of %s (%s): not a forged event", l.Data, l.Header.Get(envelope.DeadReason))
			continue
		}
		if r := l.Header.Get(envelope.DeadReason); !strings.Contains(r, want) || !strings.Contains(r, "refused by the sdk's checks") {
			t.Errorf("dead letter of %s: reason %q, want it to say %q", l.Data, r, want)
		}
		delete(reasons, string(l.Data))
	}
	if len(reasons) != 0 {
		t.Errorf("forged events not dead-lettered: %v", reasons)
	}
	retryUntil(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(handled) != 2 {
			return fmt.Errorf("handled %q, want the two genuine events", handled)
		}
		return nil
	})
	consumerIdle(t, b, manifest.EventsStreamName, "b")
	mu.Lock()
	for _, h := range handled {
		if !strings.Contains(h, "genuine") {
			t.Errorf("a handler was given %s", h)
		}
	}
	mu.Unlock()

	// With the replay window off (sdk.WithReplayWindow(0)), the old event is handed over:
	// the window is the only check it failed.
	seedE, _ := b.register("module: e\nrequires: [mesh-bus]\nconsumes: [a.x]\n")
	old := stamp(newID(), "a", time.Now().Add(-time.Hour), `{"n":6}`)
	got := make(chan string, 1)
	ce := b.client(seedE, sdk.WithReplayWindow(0))
	if err := ce.On("a.x", func(_ context.Context, e sdk.Event) error { got <- string(e.Data); return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("a", subject), Header: old, Data: []byte(`{"n":6}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-got:
		if d != `{"n":6}` {
			t.Errorf("with no replay window, e was handed %s", d)
		}
	case <-ctx.Done():
		t.Fatal("with no replay window, an old event was still refused")
	}
}

// TestCheck_OneForgedOfABatch: 31 genuine events and one whose body was changed after it
// was signed, all stored before their consumer starts, reach the sdk together (the
// signatures of what arrives at once are verified together): the 31 are handled, the forged
// one never is and is in DEAD for its signature.
func TestCheck_OneForgedOfABatch(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [x]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.x]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ca := b.client(seedA)
	subject := manifest.EventSubject("a", "x")
	js, _ := jetstream.New(b.raw(seedA, "a"))
	for i := range 32 {
		if i != 13 {
			if _, err := ca.Emit(ctx, "x", map[string]int{"genuine": i}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		h, err := envelope.Stamp(mustKey(t, seedA), "a", "alpha", subject, []byte(`{"n":13}`), envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("a", subject), Header: h, Data: []byte(`{"n":13,"forged":true}`)}); err != nil {
			t.Fatal(err)
		}
	}
	var handled atomic.Int32
	var forged atomic.Bool
	cb := b.client(seedB)
	if err := cb.On("a.x", func(_ context.Context, e sdk.Event) error {
		if strings.Contains(string(e.Data), "forged") {
			forged.Store(true)
		}
		handled.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	letters := awaitDead(t, b, manifest.DeadSubject(manifest.EventsStreamName, "b"), 1, nil)
	if r := letters[0].Header.Get(envelope.DeadReason); string(letters[0].Data) != `{"n":13,"forged":true}` || !strings.Contains(r, "signature") {
		t.Fatalf("dead letter %s: %q, want the forged event for its signature", letters[0].Data, r)
	}
	retryUntil(t, 10*time.Second, func() error {
		if n := handled.Load(); n != 31 {
			return fmt.Errorf("handled %d events, want the 31 genuine", n)
		}
		return nil
	})
	consumerIdle(t, b, manifest.EventsStreamName, "b")
	if forged.Load() || handled.Load() != 31 {
		t.Fatalf("handled %d, the forged one among them: %v", handled.Load(), forged.Load())
	}
}

// TestCheck_ForgedJobNeverReachesHolder: a job in a seat's queue whose signature is not its
// x-source's (written there by a connection that may, as the operator's) is never handed to
// the holder's handler and ends in DEAD; a job the user submitted is handled.
func TestCheck_ForgedJobNeverReachesHolder(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedW, _ := b.register("module: worker\nrequires: [mesh-bus]\nseats:\n  jobs: {scope: mesh, retain: 1h, accepts: [run]}\n")
	seedS, _ := b.register("module: shop\nrequires: [mesh-bus]\nuses: [jobs]\n")
	var mu sync.Mutex
	var ran []string
	w := b.client(seedW, sdk.WithRetryBackoff(10*time.Millisecond))
	if err := w.Accept("run", func(_ context.Context, j sdk.Job) error {
		mu.Lock()
		ran = append(ran, string(j.Data))
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	holder(t, "jobs", w)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subject := manifest.SeatAcceptSubject("jobs", "run")
	h, err := envelope.Stamp(mustSigner(t, seedS), "shop", "alpha", subject, []byte(`{"job":"genuine"}`), envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	forged := []byte(`{"job":"forged"}`) // shop's signature over another body
	if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: forged}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client(seedS).Submit(ctx, "jobs", "run", `{"job":"genuine"}`); err != nil {
		t.Fatal(err)
	}
	stream, consumer := manifest.SeatStreamName("jobs"), manifest.SeatConsumerName("jobs", manifest.ScopeMesh, "")
	letters := awaitDead(t, b, manifest.DeadSubject(stream, consumer), 1, nil)
	if letters[0].Header.Get(envelope.EventID) != h.Get(envelope.EventID) || string(letters[0].Data) != string(forged) {
		t.Errorf("dead letter %s %s, want the forged job", letters[0].Header.Get(envelope.EventID), letters[0].Data)
	}
	retryUntil(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(ran) != 1 {
			return fmt.Errorf("handled %q, want the genuine job", ran)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if ran[0] != `{"job":"genuine"}` {
		t.Errorf("the holder ran %s", ran[0])
	}
}

// TestCheck_KeysUnavailableForAWhile: while the consumer cannot learn keys (its own whoami
// refused: another connection of its key floods past the rate limit), an event from a
// module registered after it connected is kept in progress and tried again, not refused;
// once whoami answers, the event is handled and nothing is dead-lettered.
func TestCheck_KeysUnavailableForAWhile(t *testing.T) {
	t.Parallel() // mostly waits (redeliveries, a follower's back-off): it overlaps the others
	b := newBed(t)
	seedB, regB := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [\"*.x\"]\n")
	got := make(chan sdk.Event, 1)
	cb := b.client(seedB)
	if err := cb.On("*.x", func(_ context.Context, e sdk.Event) error { got <- e; return nil }); err != nil {
		t.Fatal(err)
	}
	seedD, _ := b.register("module: d\nrequires: [mesh-bus]\nemits: [x]\n")
	cd := b.client(seedD)

	// Exhaust b's whoami rate limit for a few seconds.
	flood := b.raw(seedB, "b")
	req, _ := json.Marshal(api.WhoamiRequest{PublicKey: regB.PublicKey})
	stop := make(chan struct{})
	flooded := make(chan struct{})
	var sent atomic.Int64
	go func() {
		defer close(flooded)
		end := time.After(3 * time.Second)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-end:
				return
			case <-tick.C:
				for range 50 { // every token the limit makes is taken at once
					flood.PublishRequest(api.WhoamiSubject(regB.PublicKey), "_INBOX.b.flood", req)
				}
				if flood.Flush() == nil { // the server has them: the limit is being used up
					sent.Add(50)
				}
			}
		}
	}()
	defer func() { close(stop); <-flooded }()
	retryUntil(t, 5*time.Second, func() error { // past the limit's burst of 200
		if n := sent.Load(); n < 1000 {
			return fmt.Errorf("%d whoami sent", n)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := cd.Emit(ctx, "x", `{"n":1}`)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-got:
		if e.ID != id {
			t.Errorf("handled %s, want %s", e.ID, id)
		}
	case <-ctx.Done():
		t.Fatal("the event was never handled")
	}
	if letters := deadLetters(t, b, manifest.DeadSubject(manifest.EventsStreamName, "b")); len(letters) != 0 {
		t.Errorf("%d dead letters: %s", len(letters), letters[0].Header.Get(envelope.DeadReason))
	}
}

// TestCheck_SkewedEmitterClock: a module whose clock is off (sdk.WithClock) stamps its events
// with that time; a consumer hands over those within the replay window of when the stream
// stored them, and refuses — to DEAD, saying why — one stamped beyond it.
func TestCheck_SkewedEmitterClock(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [x]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.x]\n")
	var mu sync.Mutex
	var handled []time.Time
	cb := b.client(seedB)
	if err := cb.On("a.x", func(_ context.Context, e sdk.Event) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, e.Time)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ahead := func() time.Time { return time.Now().Add(4 * time.Minute) }
	if _, err := b.client(seedA, sdk.WithClock(ahead)).Emit(ctx, "x", `{"skew":"4m"}`); err != nil {
		t.Fatal(err)
	}
	behind := func() time.Time { return time.Now().Add(-sdk.DefaultReplayWindow - time.Minute) }
	if _, err := b.client(seedA, sdk.WithClock(behind)).Emit(ctx, "x", `{"skew":"-11m"}`); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(handled) != 1 {
			return fmt.Errorf("handled %d events, want the one 4 minutes ahead", len(handled))
		}
		if d := time.Until(handled[0]); d < 3*time.Minute || d > 5*time.Minute {
			return fmt.Errorf("the event's x-time is %s from now, want about 4 minutes ahead", d.Round(time.Second))
		}
		return nil
	})
	letters := awaitDead(t, b, manifest.DeadSubject(manifest.EventsStreamName, "b"), 1, nil)
	if r := letters[0].Header.Get(envelope.DeadReason); string(letters[0].Data) != `{"skew":"-11m"}` || !strings.Contains(r, "outside the replay window") {
		t.Errorf("dead letter %s: reason %q, want the event 11 minutes behind, outside the replay window", letters[0].Data, r)
	}
}
