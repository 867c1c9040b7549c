package audit

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ackBatch builds a written batch: each element is {run, delivery sequence, stream sequence}.
func ackBatch(ds ...[3]uint64) ([]delivery, []*jetstream.MsgMetadata) {
	batch := make([]delivery, len(ds))
	mds := make([]*jetstream.MsgMetadata, len(ds))
	for i, d := range ds {
		batch[i] = delivery{Msg: delivered{seq: d[2]}, run: d[0]}
		mds[i] = &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Consumer: d[1], Stream: d[2]}}
	}
	return batch, mds
}

// ackedSeq is the stream sequence of the delivery written picked to ack; 0 for none.
func ackedSeq(d *delivery) uint64 {
	if d == nil {
		return 0
	}
	return d.Msg.(delivered).seq
}

// TestAcker_AcksTheLastOfAWholeRun: a run's deliveries written without a hole are acked
// with the one of the highest stream sequence, a redelivery (a lower stream sequence, a
// later delivery) included.
func TestAcker_AcksTheLastOfAWholeRun(t *testing.T) {
	var a acker
	ack, broke := a.written(ackBatch([3]uint64{1, 1, 10}, [3]uint64{1, 2, 11}, [3]uint64{1, 3, 12}))
	if ackedSeq(ack) != 12 || broke {
		t.Fatalf("ack %d, broke %v; want 12, false", ackedSeq(ack), broke)
	}
	// The next batch: a new event, then one redelivered after the ack wait.
	ack, broke = a.written(ackBatch([3]uint64{1, 4, 13}, [3]uint64{1, 5, 11}))
	if ackedSeq(ack) != 13 || broke {
		t.Fatalf("ack %d, broke %v; want 13, false", ackedSeq(ack), broke)
	}
}

// TestAcker_AMissingDeliveryBreaksTheRun: a delivery sequence skipped (a delivery that went
// to a stale pull, say) stops the acks at the hole: what came after it in the stream may
// lie behind the missing event. Nothing more of that run is acked or written, and the next
// run is followed from its first delivery.
func TestAcker_AMissingDeliveryBreaksTheRun(t *testing.T) {
	var a acker
	ack, broke := a.written(ackBatch([3]uint64{1, 1, 10}, [3]uint64{1, 2, 11}, [3]uint64{1, 4, 13}, [3]uint64{1, 5, 14}))
	if ackedSeq(ack) != 11 || !broke {
		t.Fatalf("ack %d, broke %v; want 11 (before the hole), true", ackedSeq(ack), broke)
	}
	if !a.dropped(delivery{run: 1}) {
		t.Fatal("a broken run's next delivery is written")
	}
	ack, broke = a.written(ackBatch([3]uint64{1, 3, 12}))
	if ack != nil || broke {
		t.Fatalf("a broken run acked %d (broke %v)", ackedSeq(ack), broke)
	}
	if a.dropped(delivery{run: 2}) {
		t.Fatal("the next run's delivery is dropped")
	}
	ack, broke = a.written(ackBatch([3]uint64{2, 1, 12}, [3]uint64{2, 2, 13}, [3]uint64{2, 3, 14}))
	if ackedSeq(ack) != 14 || broke {
		t.Fatalf("ack %d, broke %v; want 14, false", ackedSeq(ack), broke)
	}
	// A delivery sequence that goes back (a consumer leader that numbered again) breaks
	// it too.
	ack, broke = a.written(ackBatch([3]uint64{2, 2, 15}))
	if ack != nil || !broke {
		t.Fatalf("ack %d, broke %v; want none, true", ackedSeq(ack), broke)
	}
}

// TestAcker_AFailedWriteBreaksTheRun: after a batch that was not written, a following batch
// of the same run is not acked though its delivery sequence goes on without a hole: its ack
// would ack the unwritten batch.
func TestAcker_AFailedWriteBreaksTheRun(t *testing.T) {
	var a acker
	failed, _ := ackBatch([3]uint64{1, 1, 10}, [3]uint64{1, 2, 11})
	a.fail(failed)
	if !a.dropped(delivery{run: 1}) {
		t.Fatal("the failed run's next delivery is written")
	}
	if ack, _ := a.written(ackBatch([3]uint64{1, 3, 12})); ack != nil {
		t.Fatalf("acked %d after a failed write", ackedSeq(ack))
	}
	// A batch holding the end of the broken run and the start of the next acks the
	// next's.
	ack, broke := a.written(ackBatch([3]uint64{1, 4, 13}, [3]uint64{2, 1, 10}, [3]uint64{2, 2, 11}))
	if ackedSeq(ack) != 11 || broke {
		t.Fatalf("ack %d, broke %v; want 11, false", ackedSeq(ack), broke)
	}
}

// counted is a delivery whose acks are counted; the server confirms none of the first
// unconfirmed, and calls during each.
type counted struct {
	jetstream.Msg
	acks        *int
	unconfirmed int
	during      func()
}

func (m counted) DoubleAck(context.Context) error {
	*m.acks++
	if m.during != nil {
		m.during()
	}
	if *m.acks <= m.unconfirmed {
		return errors.New("timeout")
	}
	return nil
}

// TestRuns_NoAckOfAnOlderRun: once pull has reset the consumer for a newer run, an ack of
// an older run's event is not sent: the server would take its delivery sequence for the
// newer run's floor. The current run's acks are.
func TestRuns_NoAckOfAnOlderRun(t *testing.T) {
	r := newRuns()
	ctx := context.Background()
	resets := 0
	reset := func(context.Context) error { resets++; return nil }
	first, _ := r.start(ctx, reset)
	second, _ := r.start(ctx, reset)
	if first != 1 || second != 2 || resets != 2 {
		t.Fatalf("runs %d, %d after %d resets", first, second, resets)
	}
	var acks int
	if err := r.ack(ctx, delivery{Msg: counted{acks: &acks}, run: first}); err != nil || acks != 0 {
		t.Fatalf("an older run's ack was sent (%d, %v)", acks, err)
	}
	// An ack and a reset never overlap: the server could apply a reset between an ack's
	// arrival and its processing.
	locked := func() {
		if r.mu.TryLock() {
			r.mu.Unlock()
			t.Error("an ack or a reset ran without the runs' lock")
		}
	}
	if err := r.ack(ctx, delivery{Msg: counted{acks: &acks, during: locked}, run: second}); err != nil || acks != 1 {
		t.Fatalf("the current run's ack: %d sent, %v", acks, err)
	}
	// An ack the server does not confirm is sent again until one is.
	acks = 0
	if err := r.ack(ctx, delivery{Msg: counted{acks: &acks, unconfirmed: 2}, run: second}); err != nil || acks != 3 {
		t.Fatalf("an ack confirmed at the third try: %d sent, %v", acks, err)
	}
	if _, err := r.start(ctx, func(context.Context) error { locked(); return nil }); err != nil {
		t.Fatal(err)
	}
	// A failed reset starts no run.
	if _, err := r.start(ctx, func(context.Context) error { return errors.New("no") }); err == nil || r.current.Load() != second+1 {
		t.Fatalf("a failed reset: err %v, current run %d", err, r.current.Load())
	}
}

// TestRuns_TheNewestEndWins: the writer asks to end an older run, and before the watcher
// takes it, the current one: the current run's watcher ends it. (With one request slot that
// kept the first, the second was dropped and the run never ended.)
func TestRuns_TheNewestEndWins(t *testing.T) {
	r := newRuns()
	r.end(1)
	r.end(2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ended := make(chan struct{})
	go r.watch(ctx, 2, func() { close(ended) })
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("run 2 was asked to end and its watcher did not end it")
	}
	// A request for an older run does not end a newer one.
	r.end(1)
	ended3 := make(chan struct{})
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.watch(wctx, 3, func() { close(ended3) }); close(done) }()
	r.end(1)
	for len(r.wake) > 0 && wctx.Err() == nil { // until the watcher has taken the wake-up
		runtime.Gosched()
	}
	wcancel()
	<-done
	select {
	case <-ended3:
		t.Fatal("a request to end run 1 ended run 3")
	default:
	}
}
