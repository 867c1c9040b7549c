package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/jsconsume"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// benchEvent is the event the producer module emits.
const benchEvent = "bench.tick"

// EmitOnResult is the emit→on measurement: the same number of 256-byte persistent events
// through the mesh (sdk Emit → sdk On) and through raw JetStream, on the same server.
type EmitOnResult struct {
	// Events is how many events each side sent.
	Events int `json:"events"`
	// PayloadBytes is the size of every event's body.
	PayloadBytes int `json:"payload_bytes"`
	// Mesh and Raw are the two sides.
	Mesh Series `json:"mesh"`
	Raw  Series `json:"raw"`
	// Ratio is Mesh.PerSecond / Raw.PerSecond (target: ≥ 0.65).
	Ratio float64 `json:"ratio"`
	// Pipelined is the mesh with sdk.EmitAsync (then Flush); RawAsync raw JetStream async
	// publishes; RawAsyncAudited the same with one more durable consumer drained alongside,
	// as the audit log drains EVENTS.
	Pipelined       Series `json:"pipelined"`
	RawAsync        Series `json:"raw_async"`
	RawAsyncAudited Series `json:"raw_async_audited"`
	// PipelinedRatio is Pipelined / RawAsync (target ≥ 0.65); PipelinedAuditedRatio is
	// Pipelined / RawAsyncAudited (target ≥ 0.8).
	PipelinedRatio        float64 `json:"pipelined_ratio"`
	PipelinedAuditedRatio float64 `json:"pipelined_audited_ratio"`
	// RawSigned and RawAsyncSigned are the floor the seed's cryptography sets (three Ed25519
	// operations an event): raw JetStream doing it by hand with envelope's own Stamp and
	// Verify, one signature at a time — the publisher signs each event, the consumer verifies
	// each before acking, and a second durable consumer drained alongside verifies each too,
	// as the audit log must — one at a time (Raw's way) and pipelined (RawAsync's).
	RawSigned      Series `json:"raw_signed"`
	RawAsyncSigned Series `json:"raw_async_signed"`
	// SignedFloorRatio is Mesh / RawSigned (issue 41's target ≥ 0.85);
	// PipelinedSignedFloorRatio is Pipelined / RawAsyncSigned (target ≥ 1.0).
	SignedFloorRatio          float64 `json:"signed_floor_ratio"`
	PipelinedSignedFloorRatio float64 `json:"pipelined_signed_floor_ratio"`
	// Rounds is how many times each comparison with the floor ran, the mesh's side and the
	// floor's one after the other, in turn first (EmitOn). Mesh, RawSigned, Pipelined and
	// RawAsyncSigned are each the medians of their rounds' figures; SignedFloorRatio and
	// PipelinedSignedFloorRatio the medians of SignedFloorRatios and
	// PipelinedSignedFloorRatios, every round's ratio in the order run; P99Ratios every
	// round's one-at-a-time p99 against Raw's (P99Ratio is their median).
	Rounds                     int       `json:"rounds"`
	SignedFloorRatios          []float64 `json:"signed_floor_ratios"`
	PipelinedSignedFloorRatios []float64 `json:"pipelined_signed_floor_ratios"`
	P99Ratios                  []float64 `json:"p99_ratios"`
	// P99Ratio is Mesh's p99 / Raw's, one at a time (issue 41's target ≤ 1.5).
	P99Ratio float64 `json:"p99_ratio"`
}

// EmitOn measures n events on each side: bare raw JetStream one at a time first, then the
// mesh against the signed floor one at a time, rounds times (pairs), then bare raw pipelined,
// with and without a drained consumer, and last the mesh pipelined against the pipelined
// floor, rounds times. A side's figures are the medians of its rounds' (medianSeries); a
// ratio with the floor is the median of the rounds' ratios, each round's two sides run back
// to back; a ratio with bare raw, run once, is the mesh's median against it.
func EmitOn(ctx context.Context, t Target, n, rounds int) (EmitOnResult, error) {
	s, err := OpenEmitOn(ctx, t)
	if err != nil {
		return EmitOnResult{}, err
	}
	defer s.Close()
	rounds = max(rounds, 1)
	raw, err := s.Raw(ctx, n)
	if err != nil {
		return EmitOnResult{}, fmt.Errorf("raw JetStream: %w", err)
	}
	res := EmitOnResult{Events: n, PayloadBytes: PayloadSize, Raw: raw, Rounds: rounds}
	one, err := pairs(ctx, rounds, "mesh", s.Mesh, "raw JetStream signed", s.RawSigned, n)
	if err != nil {
		return res, err
	}
	res.Mesh, res.RawSigned, res.SignedFloorRatio, res.SignedFloorRatios = one.summary()
	res.Ratio = ratio(res.Mesh.PerSecond, res.Raw.PerSecond)
	res.P99Ratio = ratio(float64(res.Mesh.P99), float64(res.Raw.P99))
	for _, r := range one {
		res.P99Ratios = append(res.P99Ratios, ratio(float64(r.mesh.P99), float64(res.Raw.P99)))
	}
	if res.RawAsync, err = s.RawAsync(ctx, n, false); err != nil {
		return res, fmt.Errorf("raw JetStream pipelined: %w", err)
	}
	if res.RawAsyncAudited, err = s.RawAsync(ctx, n, true); err != nil {
		return res, fmt.Errorf("raw JetStream pipelined and drained: %w", err)
	}
	piped, err := pairs(ctx, rounds, "mesh pipelined", s.Pipelined, "raw JetStream pipelined and signed", s.RawAsyncSigned, n)
	if err != nil {
		return res, err
	}
	res.Pipelined, res.RawAsyncSigned, res.PipelinedSignedFloorRatio, res.PipelinedSignedFloorRatios = piped.summary()
	res.PipelinedRatio = ratio(res.Pipelined.PerSecond, res.RawAsync.PerSecond)
	res.PipelinedAuditedRatio = ratio(res.Pipelined.PerSecond, res.RawAsyncAudited.PerSecond)
	return res, nil
}

// round is one round of a comparison: the mesh's side and the floor's.
type round struct{ mesh, floor Series }

type rounds []round

// pairs runs the mesh's side and the floor's events events each, n rounds, the first of
// the two alternating: what one run leaves behind (the audit log's last batch, a collection)
// falls on each side alike, and the first round, on a node that has stored no event yet, is
// one of several.
func pairs(ctx context.Context, n int, meshName string, mesh func(context.Context, int) (Series, error), floorName string, floor func(context.Context, int) (Series, error), events int) (rounds, error) {
	out := make(rounds, n)
	for i := range out {
		measure := func(name string, side func(context.Context, int) (Series, error), into *Series) error {
			var err error
			if *into, err = side(ctx, events); err != nil {
				return fmt.Errorf("%s, round %d of %d: %w", name, i+1, n, err)
			}
			return nil
		}
		first, second := func() error { return measure(meshName, mesh, &out[i].mesh) }, func() error { return measure(floorName, floor, &out[i].floor) }
		if i%2 == 1 {
			first, second = second, first
		}
		if err := first(); err != nil {
			return nil, err
		}
		if err := second(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// summary is the rounds' medians: each side's (medianSeries), and the ratio of mesh to
// floor, with every round's ratio in the order run.
func (rs rounds) summary() (mesh, floor Series, r float64, ratios []float64) {
	meshes, floors := make([]Series, len(rs)), make([]Series, len(rs))
	ratios = make([]float64, len(rs))
	for i, x := range rs {
		meshes[i], floors[i] = x.mesh, x.floor
		ratios[i] = ratio(x.mesh.PerSecond, x.floor.PerSecond)
	}
	return medianSeries(meshes), medianSeries(floors), median(ratios), ratios
}

// median is the middle of xs (the lower of the two middle ones for an even count).
func median[T cmp.Ordered](xs []T) T {
	sorted := slices.Clone(xs)
	slices.Sort(sorted)
	return sorted[(len(sorted)-1)/2]
}

// medianSeries is one side's rounds as one series: each figure the median of the rounds'
// (so not one round's: its rate and its p99 may come from different rounds), Count one
// round's, Duplicates all of theirs.
func medianSeries(ss []Series) Series {
	pick := func(f func(Series) time.Duration) time.Duration {
		xs := make([]time.Duration, len(ss))
		for i, s := range ss {
			xs[i] = f(s)
		}
		return median(xs)
	}
	rates := make([]float64, len(ss))
	out := Series{Count: ss[0].Count}
	for i, s := range ss {
		rates[i] = s.PerSecond
		out.Duplicates += s.Duplicates
	}
	out.PerSecond = median(rates)
	out.Elapsed = pick(func(s Series) time.Duration { return s.Elapsed })
	out.P50 = pick(func(s Series) time.Duration { return s.P50 })
	out.P99 = pick(func(s Series) time.Duration { return s.P99 })
	out.Mean = pick(func(s Series) time.Duration { return s.Mean })
	out.Max = pick(func(s Series) time.Duration { return s.Max })
	return out
}

// EmitOnSession holds both sides of the emit→on measurement ready, so that runs of it
// (a benchmark's b.N rounds) time only events.
//
// The mesh side is two modules connected through the sdk: P emits bench.tick, C consumes
// P.bench.tick with On, so the event goes through EVENTS and C's derived durable consumer.
// The raw side is what a plain nats.go program would do on the same server with the
// operator's key: a stream of its own (BENCH_RAW_<run>, on bench.raw.<run>.>, configured
// like EVENTS) and a durable pull consumer configured like a module's (explicit ack, the
// same MaxAckPending and pull batch), with one connection publishing and another consuming,
// as the two modules have.
//
// Both sides publish the same way: one synchronous publish at a time (wait for the stream's
// ack, then send the next), which is what sdk.Emit does. The handlers are the same on both
// sides: read the send time from fixed offsets of the payload, then ack.
type EmitOnSession struct {
	t     Target
	id    string
	epoch time.Time

	op       *nats.Conn
	producer *sdk.Client
	consumer *sdk.Client
	modules  []string
	meshRec  atomic.Pointer[recorder]

	rawPub     *nats.Conn
	rawSub     *nats.Conn
	rawJS      jetstream.JetStream
	rawAsyncJS jetstream.JetStream // async publishes, at most sdk.MaxInFlight unanswered
	subJS      jetstream.JetStream
	rawStream  string
	rawSubject string
	rawConsume jetstream.ConsumeContext
	rawRec     atomic.Pointer[recorder]
	runs       int

	// The signed floor's: the publisher's key, and whether the raw consumer verifies.
	signer    *envelope.SigningKey
	signerPub string
	rawVerify atomic.Bool
	rawBad    atomic.Int64 // events a verifying raw consumer refused (none, or the floor is wrong)
}

// OpenEmitOn registers the two modules, connects them, and creates the raw stream and
// consumer. Close undoes all of it.
func OpenEmitOn(ctx context.Context, t Target) (s *EmitOnSession, err error) {
	s = &EmitOnSession{t: t, id: runID(), epoch: time.Now()}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.op, err = t.operator("bench-operator"); err != nil {
		return nil, err
	}

	p, c := "bench-p-"+s.id, "bench-c-"+s.id
	pSeed, err := t.register(ctx, s.op, "module: "+p+"\nrequires: [mesh-bus]\nemits: ["+benchEvent+"]\n")
	if err != nil {
		return nil, err
	}
	s.modules = append(s.modules, p)
	cSeed, err := t.register(ctx, s.op, "module: "+c+"\nrequires: [mesh-bus]\nconsumes: ["+p+"."+benchEvent+"]\n")
	if err != nil {
		return nil, err
	}
	s.modules = append(s.modules, c)
	if s.producer, err = connectModule(ctx, t, pSeed); err != nil {
		return nil, err
	}
	if s.consumer, err = connectModule(ctx, t, cSeed); err != nil {
		return nil, err
	}
	if err := s.consumer.On(p+"."+benchEvent, func(_ context.Context, e sdk.Event) error {
		if r := s.meshRec.Load(); r != nil {
			r.record(e.Data)
		}
		return nil
	}); err != nil {
		return nil, err
	}

	if s.rawPub, err = t.operator("bench-raw-pub"); err != nil {
		return nil, err
	}
	if s.rawSub, err = t.operator("bench-raw-sub"); err != nil {
		return nil, err
	}
	s.rawJS, _ = jetstream.New(s.rawPub)
	s.rawAsyncJS, _ = jetstream.New(s.rawPub, jetstream.WithPublishAsyncMaxPending(sdk.MaxInFlight))
	subJS, _ := jetstream.New(s.rawSub)
	s.subJS = subJS
	s.rawStream, s.rawSubject = "BENCH_RAW_"+s.id, "bench.raw."+s.id+".tick"
	ev := manifest.EventsStream()
	cctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if _, err := s.rawJS.CreateStream(cctx, jetstream.StreamConfig{
		Name:              s.rawStream,
		Subjects:          []string{"bench.raw." + s.id + ".>"},
		Retention:         jetstream.LimitsPolicy,
		MaxAge:            ev.MaxAge,
		MaxMsgsPerSubject: ev.MaxMsgsPerSubject,
		Duplicates:        ev.Duplicates,
		Storage:           jetstream.FileStorage,
		Replicas:          max(1, t.Replicas),
	}); err != nil {
		s.rawStream = ""
		return nil, fmt.Errorf("create raw stream: %w", err)
	}
	cons, err := subJS.CreateOrUpdateConsumer(cctx, s.rawStream, jetstream.ConsumerConfig{
		Durable:       "bench-raw",
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: manifest.MaxAckPending,
		MaxDeliver:    manifest.MaxDeliver,
		AckWait:       30 * time.Second,
		DeliverPolicy: jetstream.DeliverNewPolicy,
		FilterSubject: s.rawSubject,
	})
	if err != nil {
		return nil, fmt.Errorf("create raw consumer: %w", err)
	}
	// The sdk's heartbeat (jsconsume.PullHeartbeat), not nats.go's 15 s, here and on the raw
	// audit consumer: a pull the server drops is noticed and made again within seconds on both
	// sides. With the default, a CI run's raw side stalled past the measurement's 10 s and
	// failed the bench.
	s.rawConsume, err = cons.Consume(func(m jetstream.Msg) {
		if s.rawVerify.Load() && envelope.Verify(m.Headers(), m.Subject(), m.Data(), s.signerPub) != nil {
			s.rawBad.Add(1)
			m.Term()
			return
		}
		if r := s.rawRec.Load(); r != nil {
			r.record(m.Data())
		}
		m.Ack()
	}, jetstream.PullMaxMessages(manifest.MaxAckPending), jetstream.PullHeartbeat(jsconsume.PullHeartbeat))
	if err != nil {
		return nil, fmt.Errorf("consume raw: %w", err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	if s.signer, err = envelope.NewSigningKey(kp); err != nil {
		return nil, err
	}
	s.signerPub, _ = s.signer.PublicKey()
	return s, nil
}

// connectModule connects the module whose seed is seedFile through the sdk.
func connectModule(ctx context.Context, t Target, seedFile string) (*sdk.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	return sdk.Connect(ctx, t.URL, seedFile)
}

// Mesh sends n events with sdk Emit and waits until C's handler has seen each of them.
func (s *EmitOnSession) Mesh(ctx context.Context, n int) (Series, error) {
	return s.run(ctx, n, &s.meshRec, func(ctx context.Context, data []byte) error {
		_, err := s.producer.Emit(ctx, benchEvent, data)
		return err
	})
}

// Pipelined sends n events with sdk EmitAsync, then Flush, and waits until C's handler has
// seen each of them.
func (s *EmitOnSession) Pipelined(ctx context.Context, n int) (Series, error) {
	return s.runFlushed(ctx, n, &s.meshRec, func(ctx context.Context, data []byte) error {
		_, err := s.producer.EmitAsync(ctx, benchEvent, data)
		return err
	}, s.producer.Flush)
}

// RawAsync sends n events with jetstream async publishes (at most sdk.MaxInFlight
// unanswered, as EmitAsync) and waits until the raw consumer has seen each of them. With
// audited, a second durable consumer drains the stream alongside, as the audit log drains
// EVENTS: acking all, with an ack every rawAuditAckEvery events and at the stream's end.
func (s *EmitOnSession) RawAsync(ctx context.Context, n int, audited bool) (Series, error) {
	if audited {
		stop, err := s.drainAudit(ctx, false)
		if err != nil {
			return Series{}, err
		}
		defer stop()
	}
	return s.runFlushed(ctx, n, &s.rawRec, func(ctx context.Context, data []byte) error {
		_, err := s.rawAsyncJS.PublishAsync(s.rawSubject, data, jetstream.WithStallWait(requestTimeout))
		return err
	}, s.asyncComplete)
}

// asyncComplete waits for the answers to every async publish.
func (s *EmitOnSession) asyncComplete(ctx context.Context) error {
	select {
	case <-s.rawAsyncJS.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drainAudit has a second durable consumer drain the raw stream alongside, as the audit log
// drains EVENTS: acking all, with an ack every rawAuditAckEvery events and at the stream's
// end; with verify, checking each event's signature first, as the audit log must. stop ends
// it and deletes the consumer.
func (s *EmitOnSession) drainAudit(ctx context.Context, verify bool) (stop func(), err error) {
	cctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	cons, err := s.subJS.CreateOrUpdateConsumer(cctx, s.rawStream, jetstream.ConsumerConfig{
		Durable: "bench-raw-audit", AckPolicy: jetstream.AckAllPolicy, MaxAckPending: manifest.AuditMaxAckPending,
		AckWait: 30 * time.Second, DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("create the raw audit consumer: %w", err)
	}
	var drained int // Consume calls its handler on one goroutine
	drain, err := cons.Consume(func(m jetstream.Msg) {
		drained++
		if verify && envelope.Verify(m.Headers(), m.Subject(), m.Data(), s.signerPub) != nil {
			s.rawBad.Add(1)
		}
		if md, err := m.Metadata(); err != nil || md.NumPending == 0 || drained%rawAuditAckEvery == 0 {
			m.Ack()
		}
	}, jetstream.PullMaxMessages(rawAuditAckEvery), jetstream.PullHeartbeat(jsconsume.PullHeartbeat))
	if err != nil {
		return nil, fmt.Errorf("consume raw audit: %w", err)
	}
	return func() {
		drain.Stop()
		dctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		s.subJS.DeleteConsumer(dctx, s.rawStream, "bench-raw-audit")
		cancel()
	}, nil
}

// RawSigned is Raw doing the seed's cryptography by hand (the floor, EmitOnResult): each
// event stamped and signed with envelope.Stamp and published with its headers, the raw
// consumer verifying each before its ack, a second consumer drained alongside verifying each.
func (s *EmitOnSession) RawSigned(ctx context.Context, n int) (Series, error) {
	return s.signed(ctx, func() (Series, error) {
		return s.run(ctx, n, &s.rawRec, func(ctx context.Context, data []byte) error {
			msg, err := s.stamped(data)
			if err == nil {
				_, err = s.rawJS.PublishMsg(ctx, msg)
			}
			return err
		})
	})
}

// RawAsyncSigned is RawSigned pipelined, as RawAsync.
func (s *EmitOnSession) RawAsyncSigned(ctx context.Context, n int) (Series, error) {
	return s.signed(ctx, func() (Series, error) {
		return s.runFlushed(ctx, n, &s.rawRec, func(ctx context.Context, data []byte) error {
			msg, err := s.stamped(data)
			if err == nil {
				_, err = s.rawAsyncJS.PublishMsgAsync(msg, jetstream.WithStallWait(requestTimeout))
			}
			return err
		}, s.asyncComplete)
	})
}

// signed runs a signed side: the raw consumer verifying, the audit's consumer drained and
// verifying alongside; an event either refused fails it (the floor would be wrong).
func (s *EmitOnSession) signed(ctx context.Context, run func() (Series, error)) (Series, error) {
	stop, err := s.drainAudit(ctx, true)
	if err != nil {
		return Series{}, err
	}
	defer stop()
	s.rawVerify.Store(true)
	defer s.rawVerify.Store(false)
	bad := s.rawBad.Load()
	series, err := run()
	if err == nil && s.rawBad.Load() != bad {
		err = fmt.Errorf("%d signed events failed their verification", s.rawBad.Load()-bad)
	}
	return series, err
}

// stamped is data as a signed event on the raw subject: envelope's headers and signature.
func (s *EmitOnSession) stamped(data []byte) (*nats.Msg, error) {
	h, err := envelope.Stamp(s.signer, "bench-raw", "bench", s.rawSubject, data, envelope.Options{})
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: s.rawSubject, Header: h, Data: data}, nil
}

// rawAuditAckEvery is how many events the raw baseline's drained consumer acks at once: the
// audit log's largest batch.
const rawAuditAckEvery = 1024

// Raw sends n events with a jetstream publish and waits until the raw consumer has seen
// each of them.
func (s *EmitOnSession) Raw(ctx context.Context, n int) (Series, error) {
	return s.run(ctx, n, &s.rawRec, func(ctx context.Context, data []byte) error {
		_, err := s.rawJS.Publish(ctx, s.rawSubject, data)
		return err
	})
}

func (s *EmitOnSession) run(ctx context.Context, n int, slot *atomic.Pointer[recorder], publish func(context.Context, []byte) error) (Series, error) {
	return s.runFlushed(ctx, n, slot, publish, nil)
}

// runFlushed is run with flush, when set, called after the last publish (a pipelined side
// waits there for the stream's answers).
func (s *EmitOnSession) runFlushed(ctx context.Context, n int, slot *atomic.Pointer[recorder], publish func(context.Context, []byte) error, flush func(context.Context) error) (Series, error) {
	if n <= 0 {
		return Series{}, errors.New("no events to send")
	}
	s.runs++
	run := fmt.Sprintf("%s%02x", s.id[:6], s.runs%256) // a late redelivery of an earlier run is a stray
	r := newRecorder(run, s.epoch, n)
	slot.Store(r)
	defer slot.Store(nil)
	start := time.Since(s.epoch)
	for i := range n {
		pctx, cancel := context.WithTimeout(ctx, requestTimeout)
		err := publish(pctx, payload(run, i, time.Since(s.epoch)))
		cancel()
		if err != nil {
			return Series{}, fmt.Errorf("publish event %d of %d: %w", i+1, n, err)
		}
	}
	if flush != nil {
		fctx, cancel := context.WithTimeout(ctx, stall)
		err := flush(fctx)
		cancel()
		if err != nil {
			return Series{}, fmt.Errorf("flush: %w", err)
		}
	}
	if err := r.wait(ctx, stall); err != nil {
		return Series{}, err
	}
	return r.series(start), nil
}

// Close disconnects both sides, deletes the raw stream and removes the two modules.
func (s *EmitOnSession) Close() error {
	var errs []error
	if s.rawConsume != nil {
		s.rawConsume.Stop()
	}
	for _, c := range []*sdk.Client{s.producer, s.consumer} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	if s.rawStream != "" {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		errs = append(errs, s.rawJS.DeleteStream(ctx, s.rawStream))
		cancel()
	}
	for _, nc := range []*nats.Conn{s.rawPub, s.rawSub} {
		if nc != nil {
			nc.Close()
		}
	}
	if s.op != nil {
		for _, m := range s.modules {
			errs = append(errs, s.t.remove(s.op, m))
		}
		s.op.Close()
	}
	return errors.Join(errs...)
}
