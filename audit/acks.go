package audit

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
)

// The audit consumer acks all (manifest.AckAll): acking an event acks every event before it
// in EVENTS, so one ack a batch does the work of a thousand. The price is that an ack must
// never pass an event the log has not written. The log reads in runs: before each, pull
// resets the consumer to its ack floor, so a run delivers everything after the floor again,
// in stream order, and numbers its deliveries from 1. An event the log acks is safe when it
// has written every delivery of its run up to it: every event before it in the stream was
// delivered first, earlier in the run, or was acked before the run began. A delivery that
// went missing (a restart of the iteration, a reconnection, a consumer leader that moved)
// breaks the run: nothing past the hole is acked, no later batch of the run is written, and
// the log asks for a new run.

// delivery is an event as the audit consumer delivered it, and the run it came in.
type delivery struct {
	jetstream.Msg
	run uint64
}

// acker follows the runs of the audit consumer through the batches the log writes, and
// picks each batch's ack.
type acker struct {
	run    uint64 // the run it follows
	next   uint64 // the delivery sequence that run delivers next
	broken bool   // a delivery of run went missing or was not written: no more of it is acked
}

// follow starts following run, if it is newer than the one followed.
func (a *acker) follow(run uint64) {
	if run > a.run {
		a.run, a.next, a.broken = run, 1, false
	}
}

// dropped reports whether d belongs to a broken run: the next run delivers it again, so it
// is not written.
func (a *acker) dropped(d delivery) bool {
	a.follow(d.run)
	return d.run < a.run || a.broken
}

// fail breaks the run of a batch that was not written.
func (a *acker) fail(batch []delivery) {
	for _, d := range batch {
		a.follow(d.run)
	}
	a.broken = true
}

// written takes a batch the log wrote, in the order it was delivered, with the metadata of
// each delivery. It returns the delivery to ack (nil: none), and whether the run it follows
// broke on this batch: then pull must start another.
func (a *acker) written(batch []delivery, mds []*jetstream.MsgMetadata) (ack *delivery, broke bool) {
	var ackSeq uint64
	for i, d := range batch {
		if a.dropped(d) {
			continue
		}
		if mds[i].Sequence.Consumer != a.next {
			a.broken, broke = true, true
			continue
		}
		a.next++
		if s := mds[i].Sequence.Stream; ack == nil || s > ackSeq {
			ack, ackSeq = &batch[i], s
		}
	}
	return ack, broke
}

// runs is what Run's writer and pull share of the consumer's runs.
type runs struct {
	// mu keeps an ack and a reset apart. A run's ack is confirmed before the next reset,
	// and no run's ack is sent after a newer one's reset: the server would take it for
	// the newer run's, and set the floor of delivery sequences to it, far past the newer
	// run's own (JetStream ignores an ack at or below that floor).
	mu      sync.Mutex
	current atomic.Uint64 // the run pull reads, 0 before the first
	ended   atomic.Uint64 // the newest run the writer asked to end
	wake    chan struct{} // tells the watcher of the current run that one was asked to end
}

func newRuns() *runs { return &runs{wake: make(chan struct{}, 1)} }

// start resets the consumer with reset and returns the new run's number.
func (r *runs) start(ctx context.Context, reset func(context.Context) error) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := reset(ctx); err != nil {
		return 0, err
	}
	return r.current.Add(1), nil
}

// ack acks d and waits for the server to confirm it, unless a newer run has begun: that
// one starts at the ack floor and acks its own. An ack not confirmed may still be waiting in
// the consumer's queue, to be applied after a later reset: it is sent again, up to
// ackTries times, since the server takes one connection's acks in order, so a copy
// confirmed means the first was applied.
func (r *runs) ack(ctx context.Context, d delivery) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.run != r.current.Load() {
		return nil
	}
	var err error
	for range ackTries {
		actx, cancel := context.WithTimeout(ctx, manifest.AuditAckWait)
		err = d.DoubleAck(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// ackTries is how many times ack sends an ack the server does not confirm.
const ackTries = 3

// end asks pull to end run (and start another) if it is still reading it. The newest
// request wins: one for an older run, still waiting, does not hide it.
func (r *runs) end(run uint64) {
	for {
		was := r.ended.Load()
		if run <= was || r.ended.CompareAndSwap(was, run) {
			break
		}
	}
	select {
	case r.wake <- struct{}{}:
	default: // the watcher has a wake-up waiting, and reads ended when it takes it
	}
}

// watch calls end once run is asked to end, until ctx ends.
func (r *runs) watch(ctx context.Context, run uint64, end func()) {
	for {
		select {
		case <-r.wake:
			if r.ended.Load() >= run {
				end()
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
