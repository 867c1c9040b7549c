package audit

import (
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
// breaks the run: nothing more of it is acked, and the log asks for a new one.

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
func (a *acker) written(batch []delivery, mds []*jetstream.MsgMetadata) (ack jetstream.Msg, broke bool) {
	var ackSeq uint64
	for i, d := range batch {
		a.follow(d.run)
		if d.run < a.run || a.broken {
			continue
		}
		if mds[i].Sequence.Consumer != a.next {
			a.broken, broke = true, true
			continue
		}
		a.next++
		if s := mds[i].Sequence.Stream; ack == nil || s > ackSeq {
			ack, ackSeq = d.Msg, s
		}
	}
	return ack, broke
}
