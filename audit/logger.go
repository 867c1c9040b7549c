package audit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/internal/jsconsume"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

// Buckets of the audit log in the node's bbolt file.
var (
	bucketRecords   = []byte("audit")            // N → record
	bucketIDs       = []byte("audit-ids")        // event id → N
	bucketBySource  = []byte("audit-by-source")  // source \x00 N → nil
	bucketBySubject = []byte("audit-by-subject") // subject \x00 N → nil
	bucketByTime    = []byte("audit-by-time")    // received (unix ns) first N → last N (nil: first N alone)
	bucketMeta      = []byte("audit-meta")       // head: last N, its hash, last stream seq
	bucketKeys      = []byte("audit-keys")       // source → the public key its last recorded event verified with
)

// batchSize is how many events one bbolt transaction takes at most.
const batchSize = 1024

// batchWait is how long a batch gathers events after its first: the audit log is at most
// this much behind EVENTS for the sake of writing many events per transaction. Each
// transaction reads the leaf pages it writes into memory (bbolt's nodes): at 20 ms, under
// one module's flood of 2,000 events a second, those reads were a third of the node's
// allocations, and the collections they caused showed in other modules' p99 (fetch and emit
// 1.0–2.1× idle, 0.85–1.37× at 100 ms; docs/performance.md).
const batchWait = 100 * time.Millisecond

// Keys tells the logger the public key of an event's source, to verify x-signature: a
// module's registered key, a node's, the vault's; for a seat's event (source the seat) the key
// of its holder, the declaring module's — or, for a seat a node holds, of the node that held
// it at epoch (the event's x-seat-epoch; 0 when it names none) if the event was stored at
// (the stream's time) while that lease could still speak. ok is false for an unknown source.
type Keys func(subject, source string, epoch uint64, at time.Time) (publicKey string, ok bool)

// Owners tells whether source may speak for the namespace owner of a subject: a module for
// its own, the declaring module (or the mesh, for its own seats) for a seat, a node for its
// own.
type Owners func(subject, source string) bool

// Logger is the audit logger of one node.
type Logger struct {
	db     *bolt.DB
	js     jetstream.JetStream
	stream string // EVENTS, or a site's SITE_EVENTS (SetStream)
	node   string
	keys   Keys
	owners Owners
	log    *slog.Logger
	// progressEvery is how often a verify tells its progress (a second; tests shorten it).
	progressEvery time.Duration
	// retention is how long records are kept; zero keeps everything.
	retention time.Duration
	// eventsMaxAge is how long EVENTS keeps an event: usage older than it is dropped. Zero
	// keeps all usage.
	eventsMaxAge time.Duration

	records atomic.Uint64 // the number of records kept
	changes atomic.Uint64 // writes and prunes since New (Changes)
	missed  atomic.Uint64 // events that left EVENTS before the log read them (Missed)
	// notGenuine counts the records written that verify flags, by kind (NotGenuine).
	notGenuine kindCounts
	// known is the key each source's last recorded event verified with (bucketKeys): key's
	// fallback for a source the registry has forgotten.
	knownMu sync.RWMutex
	known   map[string]string
	gapLog  gapLog           // when a gap was last logged
	since   atomic.Uint64    // EVENTS' last sequence when the log began counting gaps (head.Since)
	open    gaps             // the gaps not yet counted (gaps.go); Run's alone
	clock   func() time.Time // time.Now; tests move it
	usage   usage            // bytes of EVENTS by namespace owner and hour (usage.go)

	// Ingested, when set before Run, is told after each write how many new events of each
	// namespace owner (a module, node or seat) reached the log, and their bytes: the node's
	// metrics. A redelivered event is not told again.
	Ingested func(owner string, events int, bytes int64)
	// Recorded, when set before Run, is told after each write the x-event-ids of the batch's
	// new events (a redelivery is not told again) and the newest stream time among them: the
	// admitter's pending bytes become held ones (package admit). It calls count, which makes
	// the batch's bytes count in Held, under the lock its admissions read Held under, so that
	// none sees the bytes twice (held and pending: a refusal of an event within its quota)
	// or not at all.
	Recorded func(ids []string, newest time.Time, count func())
	// Unsettled, when set before Run, says whether an event of source on subject naming seat
	// epoch epoch (x-seat-epoch) names a lease this node has not seen yet: a seat's new holder
	// speaks as soon as it holds, and this node's copy of the leases may hear of it after the
	// log reads the event. Such an event is recorded without a verdict on its signature (no
	// key known), judged again whenever it is read, and counted as not genuine only if it is
	// still unsettled deferFor after it was recorded (deferred).
	Unsettled func(subject, source string, epoch uint64) bool
	deferred  []api.AuditRecord // recorded while unsettled, not yet counted; Run's alone
}

// deferFor is how long an unsettled event waits to be counted: far longer than a lease takes
// to reach every node's copy.
const deferFor = 30 * time.Second

// deferredMost bounds what waits to be counted: past it, an unsettled event is counted at
// once (a node forging epochs by the thousand is counted, not remembered).
const deferredMost = 1024

// New returns the audit logger of node, writing to db.
func New(db *bolt.DB, js jetstream.JetStream, node string, keys Keys, owners Owners, retention time.Duration, log *slog.Logger) (*Logger, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Logger{db: db, js: js, node: node, keys: keys, owners: owners, log: log, retention: retention, progressEvery: time.Second, clock: time.Now,
		stream: manifest.EventsStreamName}
	err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRecords, bucketIDs, bucketBySource, bucketBySubject, bucketByTime, bucketMeta, bucketUsage, bucketKeys} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		l.records.Store(uint64(tx.Bucket(bucketRecords).Stats().KeyN))
		l.missed.Store(readHead(tx).Missed)
		l.known = map[string]string{}
		tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error { l.known[string(k)] = string(v); return nil })
		return l.usage.load(tx)
	})
	if err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	return l, nil
}

// SetStream makes the logger read stream instead of EVENTS (a site's SITE_EVENTS), through
// its consumer of the same name. Call it before Run.
func (l *Logger) SetStream(stream string) { l.stream = stream }

// SetEventsMaxAge tells the logger how long EVENTS keeps an event, so that usage older
// than that is dropped (see Usage). Call it before Run.
func (l *Logger) SetEventsMaxAge(d time.Duration) { l.eventsMaxAge = d }

// ConsumerName is the node's audit consumer.
func (l *Logger) ConsumerName() string { return manifest.AuditConsumer(l.node).Name }

// Records is the number of records kept.
func (l *Logger) Records() uint64 { return l.records.Load() }

// Changes counts the writes and prunes of the log since it opened: while it stands still,
// a query answers as it did.
func (l *Logger) Changes() uint64 { return l.changes.Load() }

// Run consumes EVENTS until ctx ends: each batch is written in one transaction, and acked
// with one ack, of its newest event, after it commits (acks.go says when that is safe). It is a
// pipeline: nats.go pulls the next events while a batch is checked and written, and a
// batch's signatures are checked on every core (check.go).
func (l *Logger) Run(ctx context.Context) error {
	// The events arrive on in, pulled batchSize ahead: while one batch is written, the next
	// is on its way. A run the log cannot ack past is ended through runs, and pull starts
	// another.
	in := make(chan delivery, batchSize)
	r := newRuns()
	pulled := make(chan struct{})
	go func() {
		defer close(pulled)
		l.pull(ctx, in, r)
	}()
	defer func() { <-pulled }()
	prune := time.NewTicker(time.Minute)
	defer prune.Stop()
	// What a module holds ages out slice by slice: the admitter refuses against it, so it
	// follows the stream within a slice or two (156 ms, for a 10 s max age).
	pruneUse := time.NewTicker(usageSlice(l.eventsMaxAge))
	defer pruneUse.Stop()
	var acks acker
	failed := backoff.Backoff{First: 500 * time.Millisecond, Max: 10 * time.Second}
	for {
		var first delivery
		select {
		case <-ctx.Done():
			return nil
		case <-prune.C:
			l.settleGaps()
			l.settleDeferred(l.clock())
			l.prune()
			continue
		case <-pruneUse.C:
			if l.eventsMaxAge > 0 {
				if err := l.pruneUsage(l.eventsMaxAge); err != nil {
					l.log.Error("prune EVENTS usage", "err", err)
				}
			}
			continue
		case first = <-in:
		}
		if acks.dropped(first) {
			continue
		}
		// A batch is what arrives within batchWait of its first event, up to batchSize: a
		// transaction (and its fsync) per event would cost more than the events.
		batch := []delivery{first}
		window := time.NewTimer(batchWait)
	more:
		for len(batch) < batchSize {
			select {
			case d := <-in:
				if !acks.dropped(d) {
					batch = append(batch, d)
				}
			case <-window.C:
				break more
			case <-ctx.Done():
				break more
			}
		}
		window.Stop()
		msgs := make([]jetstream.Msg, len(batch))
		for i, d := range batch {
			msgs[i] = d.Msg
		}
		mds, err := l.write(msgs)
		if err != nil {
			// Not acked, and the run is over: the next one delivers the batch again, and the
			// dedup index keeps a retry from recording twice.
			l.log.Error("audit write failed; the batch will be delivered again", "events", len(batch), "err", err)
			acks.fail(batch)
			r.end(acks.run)
			failed.Wait(ctx)
			continue
		}
		failed.Reset()
		ack, broke := acks.written(batch, mds)
		if ack != nil {
			if err := r.ack(ctx, *ack); err != nil && ctx.Err() == nil {
				l.log.Debug("audit ack not confirmed; a later one covers it", "err", err)
			}
		}
		if broke {
			l.log.Warn("audit: a delivery of EVENTS went missing; reading again from the last ack")
			r.end(acks.run)
		}
	}
}

// pull feeds in with EVENTS' events through the audit consumer until ctx ends, in runs
// (acks.go). A run ends when Run asks for another through r, or when the consumer goes
// (deleted: the node's drift check makes it again) or the connection closes under it; then
// pull finds the consumer again, resets it to its ack floor and goes on.
func (l *Logger) pull(ctx context.Context, in chan<- delivery, r *runs) {
	l.startCounting(ctx) // before the first event: gaps count from here
	wait := backoff.Backoff{First: 500 * time.Millisecond, Max: 10 * time.Second}
	for ctx.Err() == nil {
		cons, err := l.js.Consumer(ctx, l.stream, l.ConsumerName())
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("audit consumer not ready; retrying", "err", err)
				wait.Wait(ctx)
			}
			continue
		}
		if p := cons.CachedInfo().Config.AckPolicy; p != jetstream.AckAllPolicy {
			// Acking a batch's last event would leave the others to come again for ever.
			l.log.Warn("audit consumer does not ack all (an earlier meshnode made it?); waiting: delete it and the node's drift check makes it again",
				"consumer", l.ConsumerName(), "ack_policy", p.String())
			wait.Wait(ctx)
			continue
		}
		run, err := r.start(ctx, func(ctx context.Context) error {
			_, err := l.js.ResetConsumer(ctx, l.stream, l.ConsumerName())
			return err
		})
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("audit: reset the consumer to its ack floor; retrying", "err", err)
				wait.Wait(ctx)
			}
			continue
		}
		// A pull lost without a word (jsconsume.PullHeartbeat says how) is noticed by its
		// missing heartbeats: at the mesh's beat, not nats.go's 15 s, the log stands still
		// behind EVENTS for seconds, not half a minute.
		it, err := cons.Messages(jetstream.PullMaxMessages(batchSize), jetstream.PullHeartbeat(jsconsume.PullHeartbeat))
		if err != nil {
			l.log.Warn("audit: consume EVENTS; retrying", "err", err)
			wait.Wait(ctx)
			continue
		}
		wait.Reset()
		runCtx, end := context.WithCancel(ctx)
		stop := context.AfterFunc(runCtx, it.Stop)
		var watched sync.WaitGroup
		watched.Go(func() { r.watch(runCtx, run, end) })
		l.drain(runCtx, it, in, run)
		end()
		watched.Wait()
		stop()
		it.Stop()
	}
}

// drain passes it's messages to in, as deliveries of run, until it ends (stopped, its
// consumer gone, its connection closed) or ctx does.
func (l *Logger) drain(ctx context.Context, it jetstream.MessagesContext, in chan<- delivery, run uint64) {
	for {
		m, err := it.Next()
		switch {
		case errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, nats.ErrConnectionClosed) ||
			errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) || ctx.Err() != nil:
			return
		case err != nil:
			// Two missed heartbeats (a lost pull, a server gone) or another passing error:
			// nats.go pulls again.
			l.log.Warn("audit consume", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case in <- delivery{Msg: m, run: run}:
		case <-ctx.Done():
			return
		}
	}
}

// head is the end of the chain.
type head struct {
	N    uint64 `json:"n"`
	Hash string `json:"hash"`
	Seq  uint64 `json:"seq"`
	// Missed counts the events that left EVENTS before the log read them: the gaps in the
	// stream sequences it was first to see.
	Missed uint64 `json:"missed,omitempty"`
	// Since is EVENTS' last sequence when the log began counting gaps: what came before (a
	// new node reading the stream's history, with the holes the stream's limits made long
	// ago) is not this log's to miss.
	Since uint64 `json:"since,omitempty"`
}

func readHead(tx *bolt.Tx) head {
	var h head
	if b := tx.Bucket(bucketMeta).Get([]byte("head")); b != nil {
		json.Unmarshal(b, &h)
	}
	return h
}

// write records a batch in one transaction, skipping events already recorded, and returns
// each event's stream metadata.
func (l *Logger) write(msgs []jetstream.Msg) ([]*jetstream.MsgMetadata, error) {
	clock := l.clock() // with its monotonic reading, for the gaps' ages
	now := clock.UTC()
	checked, err := l.checkAll(msgs, now)
	if err != nil {
		return nil, err
	}
	var added, missed uint64
	flagged := map[string]uint64{}
	var deferred []api.AuditRecord // not counted yet: unsettled
	var learnt map[string]string   // keys the batch verified first
	var open gaps
	var lastSeq uint64
	var used map[string]map[uint64]slice // the batch's new bytes in EVENTS
	var counted map[string]int           // the batch's new events, by owner
	var newIDs []string                  // the batch's new events' ids
	var newest time.Time
	err = l.db.Update(func(tx *bolt.Tx) error {
		h := readHead(tx)
		stored := h.Seq // what the log has seen of EVENTS: a redelivery is no new byte
		if h.Since == 0 {
			h.Since = l.since.Load()
		}
		seqs := make([]uint64, len(checked))
		for i, c := range checked {
			seqs[i] = c.md.Sequence.Stream
		}
		open, missed = slices.Clone(l.open).see(stored, h.Since, seqs, clock).settle(clock)
		h.Missed += missed
		used, counted = map[string]map[uint64]slice{}, map[string]int{}
		newIDs, newest = nil, time.Time{}
		counting := map[uint64]bool{}
		recs, ids := tx.Bucket(bucketRecords), tx.Bucket(bucketIDs)
		fill(tx)
		firstN := h.N + 1 // the batch's first new record, if it has one
		for i, m := range msgs {
			md := checked[i].md
			if md.Sequence.Stream > lastSeq {
				lastSeq = md.Sequence.Stream
			}
			// New bytes: past what the log had seen, or a late one filling an open gap.
			seq := md.Sequence.Stream
			if owner := Owner(m.Subject()); owner != "" && (seq > stored || l.open.contains(seq)) && !counting[seq] {
				counting[seq] = true // once, were it twice in the batch
				if used[owner] == nil {
					used[owner] = map[uint64]slice{}
				}
				width := usageSlice(l.eventsMaxAge).Milliseconds()
				at := md.Timestamp.UnixMilli()
				start := uint64(at - at%width)
				sl := used[owner][start]
				used[owner][start] = slice{bytes: sl.bytes + size(m), newest: max(sl.newest, at)}
				counted[owner]++
				newIDs = append(newIDs, checked[i].rec.EventID)
				if md.Timestamp.After(newest) {
					newest = md.Timestamp
				}
			}
			r := checked[i].rec
			idKey := keyPart(r.EventID)
			if first := ids.Get(idKey); first != nil {
				if prev, _, err := decodeRecord(recs.Get(first)); err == nil && sameEvent(prev, r) {
					continue // a redelivery or a re-publish of the same event: recorded once
				}
				// Another event under a used id: kept, and flagged.
				r.ReusedID = binary.BigEndian.Uint64(first)
			}
			r.N, r.Prev = h.N+1, h.Hash
			b := encodeRecord(&r) // sets r.Hash
			key := u64(r.N)
			if err := recs.Put(key, b); err != nil {
				return err
			}
			if r.ReusedID == 0 {
				if err := ids.Put(idKey, key); err != nil {
					return err
				}
			}
			if err := index(tx, r); err != nil {
				return err
			}
			h.N, h.Hash, h.Seq = r.N, r.Hash, max(h.Seq, r.Seq)
			added++
			if added%yieldEvery == 0 {
				runtime.Gosched()
			}
			// Unsettled first: a lease seen between the two would count a genuine event.
			if l.unsettled(r) && len(l.deferred)+len(deferred) < deferredMost {
				deferred = append(deferred, r)
			} else if kind, _ := l.genuine(r); kind != "" {
				flagged[kind]++
			}
		}
		if lastSeq > h.Seq {
			h.Seq = lastSeq
		}
		// One entry for the batch: its records were all received at now.
		if added > 0 {
			if err := indexByTime(tx, now, firstN, h.N); err != nil {
				return err
			}
		}
		if err := l.usage.store(tx, used); err != nil {
			return err
		}
		if learnt, err = l.remember(tx, checked); err != nil {
			return err
		}
		b, _ := json.Marshal(h)
		return tx.Bucket(bucketMeta).Put([]byte("head"), b)
	})
	if err != nil {
		return nil, err
	}
	if count := func() { l.usage.merge(used) }; l.Recorded != nil && len(newIDs) > 0 {
		l.Recorded(newIDs, newest, count)
	} else {
		count()
	}
	l.records.Add(added)
	if len(learnt) > 0 {
		l.knownMu.Lock()
		maps.Copy(l.known, learnt)
		l.knownMu.Unlock()
	}
	for kind, n := range flagged {
		l.notGenuine.add(kind, n)
	}
	l.deferred = append(l.deferred, deferred...)
	l.settleDeferred(now)
	l.open = open
	l.noteMissed(missed)
	l.changes.Add(1)
	if l.Ingested != nil {
		for owner, n := range counted {
			var bytes int64
			for _, sl := range used[owner] {
				bytes += sl.bytes
			}
			l.Ingested(owner, n, bytes)
		}
	}
	mds := make([]*jetstream.MsgMetadata, len(checked))
	for i, c := range checked {
		mds[i] = c.md
	}
	return mds, nil
}

// sameEvent reports whether two records are the same event: subject, body and signature.
func sameEvent(a, b api.AuditRecord) bool {
	sig := func(r api.AuditRecord) string {
		if v := r.Headers[envelope.Signature]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	return a.Subject == b.Subject && string(a.Body) == string(b.Body) && sig(a) == sig(b)
}

// indexByTime puts the records first to last, received at the same time, in the index by
// time: one entry.
func indexByTime(tx *bolt.Tx, received time.Time, first, last uint64) error {
	return tx.Bucket(bucketByTime).Put(append(u64(uint64(received.UnixNano())), u64(first)...), u64(last))
}

// index puts r in the indexes by source and by subject. The index by time takes a batch in
// one entry (indexByTime).
func index(tx *bolt.Tx, r api.AuditRecord) error {
	bySource, bySubject := indexKeys(r, u64(r.N))
	if err := tx.Bucket(bucketBySource).Put(bySource, nil); err != nil {
		return err
	}
	return tx.Bucket(bucketBySubject).Put(bySubject, nil)
}

// indexKeys are r's keys, record n, in the indexes by source and by subject.
func indexKeys(r api.AuditRecord, n []byte) (bySource, bySubject []byte) {
	return append(sourcePrefix(r.Source), n...), append([]byte(r.Subject+"\x00"), n...)
}

// fill sets how full bbolt packs the pages of the buckets a batch writes. Records, and the
// index by time, only ever grow at their end, and ids nearly so (UUIDv7 begin with their
// time): packed full, not at bbolt's half for inserts anywhere, they take half the pages,
// and a transaction writes half as many. The indexes by source and by subject grow at the
// end of each source's and subject's range: a page split there keeps room for the range.
func fill(tx *bolt.Tx) {
	tx.Bucket(bucketRecords).FillPercent = 1
	tx.Bucket(bucketByTime).FillPercent = 1
	tx.Bucket(bucketIDs).FillPercent = 0.9
	tx.Bucket(bucketBySource).FillPercent = 0.9
	tx.Bucket(bucketBySubject).FillPercent = 0.9
}

// checkedMsg is an event's record before it joins the chain, and its stream metadata.
type checkedMsg struct {
	rec api.AuditRecord
	md  *jetstream.MsgMetadata
	pub string // the key its signature verified with, "" for none
}

// checkAll checks each event of a batch (its signature most of the cost) on every core but
// one, before the batch's transaction; each core verifies its share of the signatures
// together (envelope.VerifyBatch: about half the cost of one at a time at 32 and more). The
// core left is the other modules': on 2 cores, checking a flood's burst on both put another
// module's emit behind it (its p99 under another module's 2,000 emits/s fell from
// 2.25–3.36 ms to 1.79–2.96 ms over six runs each), and the audited rate did not move
// (13.1–14.0 k/s both ways, BenchmarkAuditSustained pipelined, before batches).
func (l *Logger) checkAll(msgs []jetstream.Msg, now time.Time) ([]checkedMsg, error) {
	out := make([]checkedMsg, len(msgs))
	errs := make([]error, len(msgs))
	do := func(from, to int) {
		var (
			signed []envelope.Signed
			at     []int // signed's events
		)
		for i := from; i < to; i++ {
			md, err := msgs[i].Metadata()
			if err != nil {
				errs[i] = err
				continue
			}
			rec, pub := l.record(msgs[i], md.Sequence.Stream, md.Timestamp, now)
			out[i] = checkedMsg{rec: rec, md: md, pub: pub}
			if pub != "" {
				signed = append(signed, envelope.Signed{Header: msgs[i].Headers(), Subject: rec.Subject, Body: rec.Body, PublicKey: pub})
				at = append(at, i)
			}
		}
		for start := 0; start < len(signed); start += yieldEvery {
			end := min(start+yieldEvery, len(signed))
			for j, err := range envelope.VerifyBatch(signed[start:end]) {
				out[at[start+j]].verified(err)
			}
			runtime.Gosched()
		}
	}
	workers := min(runtime.GOMAXPROCS(0)-1, (len(msgs)+minPerWorker-1)/minPerWorker)
	if workers <= 1 {
		do(0, len(msgs))
		return out, errors.Join(errs...)
	}
	var wg sync.WaitGroup
	per := (len(msgs) + workers - 1) / workers
	for from := 0; from < len(msgs); from += per {
		wg.Go(func() { do(from, min(from+per, len(msgs))) })
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// yieldEvery is how many events the log checks, or writes, between yields of its goroutine
// (runtime.Gosched). A batch is up to 100 ms of events, and checking and writing it is a burst
// of milliseconds on one goroutine; the Go scheduler preempts a goroutine that runs on only
// after 10 ms, and on 2 cores whatever waited behind the burst on its P — a module's handler,
// the server's delivery — waited that long: the mesh's one-at-a-time p99 was 2.2–3.7× bare
// raw's. Yielding every 64 (under a millisecond) brought it to 0.79–1.09× in three runs of
// `meshnode bench` (128: 1.48–1.53×); the audited rate, 19.9–20.0 k/s against 22.1 k/s
// without yields in one run each, still keeps up at the peak pipelined rate (docs/performance.md,
// "Why the one-at-a-time p99 was 3× raw's").
const yieldEvery = 64

// minPerWorker is the fewest events worth a goroutine of their own in checkAll.
const minPerWorker = 16

// check builds the record of one event: its envelope, its signature, its source; verified
// is the key its signature verified with ("" for none).
func (l *Logger) check(m jetstream.Msg, seq uint64, now time.Time) (api.AuditRecord, string) {
	r, pub := l.record(m, seq, now, now)
	if pub == "" {
		return r, ""
	}
	c := checkedMsg{rec: r, pub: pub}
	c.verified(envelope.Verify(m.Headers(), r.Subject, r.Body, pub))
	return c.rec, c.pub
}

// record builds the record of one event but for its signature's verdict: pub is the key to
// verify it with, "" when it cannot be (unsigned, or no key known: the record says which).
func (l *Logger) record(m jetstream.Msg, seq uint64, stored, now time.Time) (r api.AuditRecord, pub string) {
	h := m.Headers()
	// A replay is the event first published on the original subject, recorded once.
	r = api.AuditRecord{Seq: seq, Subject: validUTF8(manifest.Original(m.Subject())), Headers: validHeaders(h), Body: m.Data(), Received: now,
		EventID: validUTF8(h.Get(envelope.EventID)), Source: validUTF8(h.Get(envelope.Source))}
	if r.EventID == "" {
		r.EventID = fmt.Sprintf("seq-%d", seq)
	}
	r.SourceMatches = l.owners(r.Subject, r.Source)
	epoch := seatEpoch(h)
	key, ok := l.key(r.Subject, r.Source, epoch, stored)
	switch {
	case h.Get(envelope.Signature) == "":
		r.SignatureError = unsignedPrefix + ": no x-signature"
	case epoch != 0 && l.Unsettled != nil && l.Unsettled(r.Subject, r.Source, epoch): // only a node-held seat's event names one
		r.SignatureError = fmt.Sprintf("%s %q at seat epoch %d: a lease this node had not seen when it recorded the event", noKeyPrefix, r.Source, epoch)
	case !ok:
		r.SignatureError = fmt.Sprintf("%s %q", noKeyPrefix, r.Source)
	default:
		pub = key
	}
	return r, pub
}

// verified records the verdict on c's signature by c.pub: c.pub stays the key it verified
// with, or is cleared.
func (c *checkedMsg) verified(err error) {
	if err != nil {
		c.rec.SignatureError, c.pub = err.Error(), ""
		return
	}
	c.rec.Signed = true
}

// key is the public key source signs subject with: the node's (Keys), else the one the
// source's last recorded event verified with. A server that left the mesh, or a module
// removed, is forgotten by the registry, yet its last events (`left`, its seat released)
// may reach the log after that, and verify reads them long after: they stay genuine.
func (l *Logger) key(subject, source string, epoch uint64, at time.Time) (string, bool) {
	if pub, ok := l.keys(subject, source, epoch, at); ok {
		return pub, true
	}
	l.knownMu.RLock()
	defer l.knownMu.RUnlock()
	pub, ok := l.known[source]
	return pub, ok
}

// unsettled says whether r was recorded without a verdict because it named a seat's lease this
// node had not seen (Unsettled), and still does.
func (l *Logger) unsettled(r api.AuditRecord) bool {
	return l.Unsettled != nil && !r.Signed && strings.HasPrefix(r.SignatureError, noKeyPrefix) &&
		l.Unsettled(r.Subject, r.Source, seatEpoch(nats.Header(r.Headers)))
}

// settleDeferred counts the deferred records that are settled now, or waited deferFor:
// genuine ones not at all, the rest by the kind they are judged now.
func (l *Logger) settleDeferred(now time.Time) {
	keep := l.deferred[:0]
	for _, r := range l.deferred {
		if now.Sub(r.Received) < deferFor && l.unsettled(r) {
			keep = append(keep, r)
			continue
		}
		if kind, _ := l.genuine(r); kind != "" {
			l.notGenuine.add(kind, 1)
		}
	}
	clear(l.deferred[len(keep):])
	l.deferred = keep
}

// seatEpoch is h's x-seat-epoch, 0 when it has none (or not a number).
func seatEpoch(h nats.Header) uint64 {
	e, _ := strconv.ParseUint(h.Get(envelope.SeatEpoch), 10, 64)
	return e
}

// remember keeps the keys the batch's new records verified with, in tx; learnt returns
// what to add to the memory once tx commits.
func (l *Logger) remember(tx *bolt.Tx, checked []checkedMsg) (learnt map[string]string, err error) {
	l.knownMu.RLock()
	defer l.knownMu.RUnlock()
	for _, c := range checked {
		if c.pub == "" || l.known[c.rec.Source] == c.pub || learnt[c.rec.Source] == c.pub || c.rec.Source == "" {
			continue
		}
		if err := tx.Bucket(bucketKeys).Put(keyPart(c.rec.Source), []byte(c.pub)); err != nil {
			return nil, err
		}
		if learnt == nil {
			learnt = map[string]string{}
		}
		learnt[c.rec.Source] = c.pub
	}
	return learnt, nil
}

// How a record's SignatureError begins when the event was not signed, or its source had no
// key: verify tells these from a signature that does not verify.
const (
	unsignedPrefix = "unsigned"
	noKeyPrefix    = "no registered key for source"
)

// validUTF8 is s as the record's JSON keeps it. JSON writes an invalid byte as U+FFFD, so
// the record read back would differ from the one hashed at ingest, and verify would call a
// genuine event altered: any emitter could break the chain with one header value. The
// signature is checked on the bytes received, before this.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// validHeaders is h with every name and value made valid UTF-8 (a copy; h is not changed).
func validHeaders(h nats.Header) map[string][]string {
	if h == nil {
		return nil
	}
	out := make(map[string][]string, len(h))
	for k, vs := range h {
		k = validUTF8(k)
		for _, v := range vs {
			out[k] = append(out[k], validUTF8(v))
		}
	}
	return out
}

// prune drops records older than the retention, if one is set. The chain stays verifiable
// from the oldest record kept.
func (l *Logger) prune() {
	if l.retention <= 0 {
		return
	}
	cutoff := time.Now().Add(-l.retention)
	var dropped uint64
	var odd [][]byte
	err := l.db.Update(func(tx *bolt.Tx) error {
		fill(tx)
		// The entries by time received before the cutoff say the newest record to drop
		// (upTo), and every record up to it goes: the chain stays whole from the first one
		// kept, even where one received earlier has a later time (the clock stepped back) or
		// has no entry.
		headN := readHead(tx).N
		var old [][]byte
		var upTo uint64
		c := tx.Bucket(bucketByTime).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 16 {
				continue
			}
			if int64(binary.BigEndian.Uint64(k[:8])) >= cutoff.UnixNano() {
				break
			}
			first, last := binary.BigEndian.Uint64(k[8:]), binary.BigEndian.Uint64(k[8:])
			switch {
			case len(v) == 8 && binary.BigEndian.Uint64(v) >= first && binary.BigEndian.Uint64(v) <= headN:
				last = binary.BigEndian.Uint64(v) // a batch's
			case len(v) != 0: // not one this log writes: its first record alone
				odd = append(odd, slices.Clone(k))
			} // empty: an older log's entry, a record's alone
			upTo = max(upTo, min(last, headN))
			old = append(old, k)
		}
		// Collect first: deleting under a bbolt cursor can skip the next key.
		var ns [][]byte
		rc := tx.Bucket(bucketRecords).Cursor()
		for k, _ := rc.First(); len(k) == 8 && binary.BigEndian.Uint64(k) <= upTo; k, _ = rc.Next() {
			ns = append(ns, k)
		}
		var anchor *api.AuditRecord
		for _, n := range ns {
			r, err := dropRecord(tx, n)
			if err != nil {
				return err
			}
			if r != nil {
				anchor = r
			}
			dropped++
		}
		if anchor != nil {
			// The chain now starts after this record: verify checks the first kept record
			// against it.
			b, _ := json.Marshal(head{N: anchor.N, Hash: anchor.Hash})
			if err := tx.Bucket(bucketMeta).Put([]byte("anchor"), b); err != nil {
				return err
			}
		}
		for _, k := range old {
			if err := tx.Bucket(bucketByTime).Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		l.log.Error("prune audit log", "err", err)
		return
	}
	for _, k := range odd {
		l.log.Warn("audit log: an entry of its index by time that it does not write; its first record was pruned, the rest left", "key", fmt.Sprintf("%x", k))
	}
	if dropped > 0 {
		l.records.Add(^(dropped - 1))
		l.changes.Add(1)
		l.log.Info("audit log pruned", "records", dropped, "older_than", cutoff)
	}
}

// dropRecord deletes record n and its index entries but the one by time, and returns it
// (nil when it cannot be read).
func dropRecord(tx *bolt.Tx, n []byte) (*api.AuditRecord, error) {
	recs := tx.Bucket(bucketRecords)
	r, _, err := decodeRecord(recs.Get(n))
	if err != nil {
		return nil, recs.Delete(n)
	}
	if ids := tx.Bucket(bucketIDs); bytes.Equal(ids.Get(keyPart(r.EventID)), n) {
		ids.Delete(keyPart(r.EventID)) // not a later event's that reused the id
	}
	bySource, bySubject := indexKeys(r, n)
	tx.Bucket(bucketBySource).Delete(bySource)
	tx.Bucket(bucketBySubject).Delete(bySubject)
	return &r, recs.Delete(n)
}

func u64(n uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, n)
	return b
}

// gapLog spaces the warnings about gaps: one every gapLogEvery at most, with the count
// since the last.
type gapLog struct {
	mu      sync.Mutex
	last    time.Time
	pending uint64
}

const gapLogEvery = 10 * time.Second

// due adds n missed events and reports whether to log now, and how many since the last.
func (g *gapLog) due(n uint64) (uint64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending += n
	if g.pending == 0 || time.Since(g.last) < gapLogEvery {
		return 0, false
	}
	g.last = time.Now()
	n, g.pending = g.pending, 0
	return n, true
}

// Missed is how many events left EVENTS before this log read them (evicted by the
// stream's per-subject cap or age limit while the log was behind, or deleted): each is a
// gap in the record.
func (l *Logger) Missed() uint64 { return l.missed.Load() }

// Status reads the log's counters and its lag behind EVENTS (`meshnode status`'s audit row).
func (l *Logger) Status(ctx context.Context, js jetstream.JetStream) api.NodeAuditStatus {
	st := api.NodeAuditStatus{Records: l.Records(), Missed: l.Missed()}
	// The ack floor, not the last sequence written: after a crash the batch that was in
	// flight is redelivered while later events are already written.
	if c, err := js.Consumer(ctx, l.stream, l.ConsumerName()); err == nil {
		st.Audited = c.CachedInfo().AckFloor.Stream
	}
	if s, err := js.Stream(ctx, l.stream); err == nil {
		if last := s.CachedInfo().State.LastSeq; last > st.Audited {
			st.Lag = last - st.Audited
		}
	}
	return st
}

// NotGenuine counts, by kind (api.AuditFlag…), the records this log wrote since it opened
// that are not genuine events: what verify would flag, as it stood at ingest.
func (l *Logger) NotGenuine() map[string]uint64 { return l.notGenuine.snapshot() }

// NotGenuineKinds are the kinds NotGenuine counts.
var NotGenuineKinds = []string{api.AuditFlagUnsigned, api.AuditFlagUnknownSource, api.AuditFlagBadSignature,
	api.AuditFlagSourceMismatch, api.AuditFlagReusedID, api.AuditFlagBadID}

// kindCounts are counters by kind, safe for concurrent use.
type kindCounts struct {
	mu sync.Mutex
	m  map[string]uint64
}

func (k *kindCounts) add(kind string, n uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]uint64{}
	}
	k.m[kind] += n
}

func (k *kindCounts) snapshot() map[string]uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.m)
}

// noteMissed counts missed events, and logs them at most every gapLogEvery (with what the
// last interval held back).
func (l *Logger) noteMissed(missed uint64) {
	total := l.missed.Add(missed)
	if n, ok := l.gapLog.due(missed); ok {
		l.log.Warn("events left EVENTS before this node's audit log read them: the log has a gap (EVENTS' per-subject cap or age limit evicted them while the log was behind, or they were deleted)",
			"events", n, "missed_total", total)
	}
}

// settleGaps counts the gaps that stayed open past gapConfirm while no batch came to
// count them.
func (l *Logger) settleGaps() {
	open, missed := slices.Clone(l.open).settle(l.clock())
	if missed > 0 {
		err := l.db.Update(func(tx *bolt.Tx) error {
			h := readHead(tx)
			h.Missed += missed
			b, _ := json.Marshal(h)
			return tx.Bucket(bucketMeta).Put([]byte("head"), b)
		})
		if err != nil {
			l.log.Error("audit: record missed events", "err", err)
			return
		}
		l.open = open
	}
	l.noteMissed(missed)
}

// startCounting sets where the log begins counting gaps, when its head has not: EVENTS'
// last sequence now, asked until it answers or ctx ends.
func (l *Logger) startCounting(ctx context.Context) {
	var since uint64
	l.db.View(func(tx *bolt.Tx) error { since = readHead(tx).Since; return nil })
	if since > 0 {
		l.since.Store(since)
		return
	}
	wait := backoff.Backoff{First: 500 * time.Millisecond, Max: 10 * time.Second}
	for ctx.Err() == nil {
		s, err := l.js.Stream(ctx, l.stream)
		if err == nil {
			l.since.Store(max(s.CachedInfo().State.LastSeq, 1))
			return
		}
		wait.Wait(ctx)
	}
}

// maxKeyPart is the longest emitter-chosen value (x-event-id, x-source) an index key holds
// as it is; bbolt refuses keys over 32 KiB, and a refused key would fail its batch on every
// redelivery, stopping the log.
const maxKeyPart = 1024

// sourcePrefix is what every by-source index key of source begins with.
func sourcePrefix(source string) []byte { return append(keyPart(source), 0) }

// keyPart is s as the first part of an index key: itself, or past maxKeyPart its SHA-256
// after a 0xff byte (which valid UTF-8, as validUTF8 makes every value, never holds).
func keyPart(s string) []byte {
	if len(s) <= maxKeyPart {
		return []byte(s)
	}
	sum := sha256.Sum256([]byte(s))
	return append([]byte{0xff}, hex.EncodeToString(sum[:])...)
}
