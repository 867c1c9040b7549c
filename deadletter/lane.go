package deadletter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"slices"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Each consumer's deaths go through a lane of their own: one goroutine that writes them in
// the order they came, so a letter DEAD cannot take for now (retried for up to
// deadWriteBudget) holds only its own consumer's later letters. Before it writes, a lane keeps
// its consumer within its share of DEAD: it knows the consumer's letters (read from DEAD when
// the lane opens, then kept by its own writes) and removes the oldest until the next fits. So
// one consumer dying without end loses its own oldest letters, never another's, and DEAD,
// which holds a share for every consumer (checked at registration), never fills.
//
// Every node writes every death, each with its own lanes: the letters are the same (one
// Nats-Msg-Id per death), their ledgers hold the same sequences, and a letter one node has
// removed is only not found by another.

// Bounds of a lane.
const (
	// laneQueue is how many deaths one consumer's lane holds waiting; past it a death's
	// letter is lost, counted, and only that consumer's.
	laneQueue = 256
	// laneIdle is how long a lane stays open without a death. A closed lane holds no
	// memory; the next death opens it again, and it reads its consumer's letters anew.
	laneIdle = time.Minute
	// evictionReportEvery is how often, at most, a consumer's evictions are reported.
	evictionReportEvery = time.Minute
)

// storeOverhead is what DEAD's file store counts for a message beyond its subject, headers
// and body: nats-server's fileStoreMsgSizeRaw (server/filestore.go, 2.15.2) with headers
// — record length, sequence, time, subject length, header length and hash.
const storeOverhead = 22 + 4 + 8

// letterSize is what a letter with subject, headers h and body takes of DEAD, as its byte
// limits count it: the header block as nats.go sends it, plus the store's record.
func letterSize(subject string, h nats.Header, body []byte) int64 {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(textproto.TrimString(v)) + len(": \r\n")
		}
	}
	return int64(storeOverhead + len(subject) + n + len(body))
}

// lane writes one consumer's deaths in turn; its fields past deaths are its goroutine's own.
type lane struct {
	stream, consumer string
	deaths           chan death

	dead     jetstream.Stream // DEAD, looked up once a lane
	read     bool             // ledger holds what DEAD held when the lane opened
	ledger   []letter         // the consumer's letters in DEAD, oldest first
	used     int64            // the ledger's bytes
	pending  Eviction         // evictions not reported yet
	reported time.Time
}

// letter is one of a consumer's letters in DEAD: its sequence and its size (letterSize).
type letter struct {
	seq  uint64
	size int64
}

// enqueue hands dd to its consumer's lane, opening the lane if it is not open; false when the
// lane's queue is full. It never waits.
func (d *Writer) enqueue(dd death) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return true // the node is stopping: a write now would be given up at once
	}
	key := manifest.DeadSubject(dd.stream, dd.consumer)
	l := d.lanes[key]
	if l == nil {
		l = &lane{stream: dd.stream, consumer: dd.consumer, deaths: make(chan death, laneQueue),
			pending: Eviction{Stream: dd.stream, Consumer: dd.consumer, Share: d.share}}
		d.lanes[key] = l
		d.wg.Add(1)
		go d.run(key, l)
	}
	select {
	case l.deaths <- dd:
		return true
	default:
		return false
	}
}

// run writes l's deaths until the writer closes or no death has come for laneIdle. A lane
// closes under d.mu and only with an empty queue, and enqueue sends under d.mu: no death is
// handed to a lane that has closed.
func (d *Writer) run(key string, l *lane) {
	defer d.wg.Done()
	defer d.reportEvictions(l)
	idle := time.NewTimer(laneIdle)
	defer idle.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case dd := <-l.deaths:
			d.take(l, dd)
			if time.Since(l.reported) >= evictionReportEvery {
				d.reportEvictions(l)
			}
			idle.Reset(laneIdle)
		case <-idle.C:
			d.mu.Lock()
			if len(l.deaths) == 0 {
				delete(d.lanes, key)
				d.mu.Unlock()
				return
			}
			d.mu.Unlock()
			idle.Reset(laneIdle)
		}
	}
}

// reportEvictions tells what l removed since the last report, if anything.
func (d *Writer) reportEvictions(l *lane) {
	if l.pending.Letters == 0 {
		return
	}
	if d.report != nil {
		d.report(l.pending)
	}
	l.pending.Letters, l.pending.Bytes, l.reported = 0, 0, time.Now()
}

// makeRoom removes l's consumer's oldest letters until a letter of size fits in its share.
func (d *Writer) makeRoom(ctx context.Context, l *lane, size int64) error {
	if d.share <= 0 {
		return nil
	}
	if l.dead == nil {
		dead, err := d.js.Stream(ctx, manifest.DeadStreamName)
		if err != nil {
			return fmt.Errorf("look up DEAD: %w", err)
		}
		l.dead = dead
	}
	if !l.read {
		if err := d.readLedger(ctx, l); err != nil {
			return err
		}
	}
	for l.used+size > d.share && len(l.ledger) > 0 {
		old := l.ledger[0]
		err := l.dead.DeleteMsg(ctx, old.seq)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("remove letter %d, the oldest of consumer %s > %s, to keep it within its share: %w", old.seq, l.stream, l.consumer, err)
		}
		if err == nil { // not found: aged out, dropped, replayed, or another node's lane removed it
			d.evicted.WithLabelValues(l.stream, l.consumer).Inc()
			l.pending.Letters++
			l.pending.Bytes += old.size
			d.log.Warn("dead letter removed: its consumer is over its share of DEAD (dead-max-bytes-per-consumer)", "stream", l.stream,
				"consumer", l.consumer, "dead_seq", old.seq, "bytes", old.size, "share", d.share)
		}
		l.ledger, l.used = l.ledger[1:], l.used-old.size
	}
	return nil
}

// readLedger reads what l's consumer holds in DEAD, oldest first.
func (d *Writer) readLedger(ctx context.Context, l *lane) error {
	subject := manifest.DeadSubject(l.stream, l.consumer)
	l.ledger, l.used, l.read = nil, 0, true
	for seq := uint64(1); ; {
		m, err := l.dead.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			l.read = false
			return fmt.Errorf("read the letters of consumer %s > %s: %w", l.stream, l.consumer, err)
		}
		l.wrote(m.Sequence, letterSize(m.Subject, m.Header, m.Data))
		seq = m.Sequence + 1
	}
	return nil
}

// wrote records a letter of l's consumer stored at seq, unless the ledger has it already (a
// duplicate of a letter read with the ledger) or has not been read. DEAD keeps
// DefaultDeadMaxPerConsumer letters of a consumer and drops the oldest past it: so does the
// ledger.
func (l *lane) wrote(seq uint64, size int64) {
	if !l.read {
		return
	}
	i, found := slices.BinarySearchFunc(l.ledger, seq, func(e letter, seq uint64) int { return cmp.Compare(e.seq, seq) })
	if found {
		return
	}
	l.ledger = slices.Insert(l.ledger, i, letter{seq: seq, size: size})
	l.used += size
	if len(l.ledger) > manifest.DefaultDeadMaxPerConsumer {
		l.used -= l.ledger[0].size
		l.ledger = l.ledger[1:]
	}
}
