package deadletter

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// The node, not the client library, writes dead letters (DESIGN §3): a module in any
// language gets the same guarantee, and no module can write DEAD (it could forge what
// `dead replay` republishes). JetStream tells who gave up on what in two advisories, both
// checked on nats-server 2.15.2 (server/consumer.go):
//   - MAX_DELIVERIES.<stream>.<consumer> when a message passes the consumer's MaxDeliver;
//     the message stays in its stream (a work queue keeps it too) and is delivered no more;
//   - MSG_TERMINATED.<stream>.<consumer> when a client terminates a message (+TERM), with
//     the client's reason: how the sdk gives up with its handler's error. A Term is an ack,
//     so on a work-queue stream the message is gone before the advisory arrives: the sdk
//     never terminates a seat's job, it lets it pass MaxDeliver.
//
// Every node writes every death, idempotently: the dead letter's Nats-Msg-Id is fixed by the
// death (stream, consumer, stream sequence, deliveries), so DEAD's duplicate window stores it
// once however many nodes write it. A single writer (the mesh-controller's holder) would lose
// the deaths of a hand-over, and JetStream sends an advisory only to whoever listens at that
// moment (consumer.go sendAdvisory checks interest first): nothing would replay it.
//
// The advisory names the stream sequence, and a client can send +TERM for any sequence on its
// own ack subject: the message read is checked against the consumer's filter, so a module
// cannot dead-letter (and have an operator replay) an event it does not consume.

// Advisory subjects (server.JSAdvisoryConsumerMaxDeliveryExceedPre and
// server.JSAdvisoryConsumerMsgTerminatedPre), each followed by .<stream>.<consumer>.
const (
	advisoryMaxDeliveries = server.JSAdvisoryConsumerMaxDeliveryExceedPre
	advisoryTerminated    = server.JSAdvisoryConsumerMsgTerminatedPre
)

// Reasons written when the client gave none.
const (
	reasonMaxDeliveries = "max deliveries"
	reasonTerminated    = "terminated by the consumer"
)

// maxDeadReason bounds x-dead-reason, in bytes: a reason is a client's error text.
const maxDeadReason = 1024

// deadWriteBudget is how long the node keeps trying to store one dead letter (DEAD without a
// leader for a while, a node starting) before it logs the death as lost. Only the letters of
// the same consumer wait for it: each consumer has a lane of its own (lane.go).
const deadWriteBudget = time.Minute

// WriterPermissions are the dead-letter writer's connection's, whose inbox prefix is inbox:
// hear the advisories, read a message by sequence, look a consumer's filter up, write DEAD,
// delete a work queue's dead message and a consumer's oldest letters past its share. The
// JetStream API's subjects name a stream by token, so delete is any stream's: a work queue
// is only told apart by its name.
func WriterPermissions(inbox string) manifest.Permissions {
	return manifest.Permissions{
		Publish: []string{
			manifest.DeadStream().Subjects[0],
			"$JS.API.STREAM.INFO.*",
			"$JS.API.STREAM.MSG.GET.*",
			"$JS.API.STREAM.MSG.DELETE.*",
			"$JS.API.CONSUMER.INFO.*.*",
		},
		Subscribe: []manifest.Subscription{
			{Subject: advisoryMaxDeliveries + ".*.*"},
			{Subject: advisoryTerminated + ".*.*"},
			{Subject: inbox + ".>"}, // the JetStream API's replies
		},
	}
}

// death is one message a consumer gave up on, as an advisory tells it.
type death struct {
	stream, consumer string
	seq              uint64 // the message's stream sequence
	deliveries       uint64
	reason           string
	terminated       bool // by the client (+TERM), not by MaxDeliver
}

// id is the dead letter's Nats-Msg-Id: the same on every node that writes this death, and
// new for each death (a replayed event is a new message, with a new sequence). A message
// dies once per consumer, so the delivery count is not part of it: a client's +TERM names
// any count, and forged ones for one message must not make one letter each.
func (d death) id() string {
	return "dead." + d.stream + "." + d.consumer + "." + strconv.FormatUint(d.seq, 10)
}

// workQueue reports whether the death is a seat's job: its stream deletes a message only when
// it is acked, so the node removes it once its dead letter is stored.
func (d death) workQueue() bool { return strings.HasPrefix(d.stream, manifest.SeatStreamName("")) }

// WriterConfig is what the dead-letter writer takes from its node.
type WriterConfig struct {
	// Conn is the writer's own connection, with WriterPermissions only. The writer owns it
	// from OpenWriter on: it closes it at Close, or when OpenWriter fails.
	Conn *nats.Conn
	// Logger logs each letter written and each death not written.
	Logger *slog.Logger
	// Share is the most of DEAD one consumer's letters may hold, in bytes as DEAD counts
	// them (subject, headers, body and the store's record): the writer removes the
	// consumer's own oldest letters to write its next within it, and keeps no letter
	// larger. Zero: no share, DEAD's own limits only.
	Share int64
	// Written counts each letter stored (not a duplicate), by stream and consumer.
	Written *prometheus.CounterVec
	// Evicted counts the letters removed to keep a consumer within its share, and Lost the
	// deaths whose letter was not written, by stream and consumer.
	Evicted, Lost *prometheus.CounterVec
	// Report, when set, is told what a consumer lost to its share: at most once a minute
	// for each consumer, and when its lane closes (the node makes it an event, which the
	// audit log records).
	Report func(Eviction)
}

// Eviction is what the writer removed of one consumer's letters to keep it within its share.
type Eviction struct {
	Stream, Consumer string
	// Letters and Bytes are what was removed, since the last report; Share is the share.
	Letters int
	Bytes   int64
	Share   int64
}

// Writer is a node's dead-letter writer.
type Writer struct {
	log     *slog.Logger
	nc      *nats.Conn
	js      jetstream.JetStream
	share   int64
	written *prometheus.CounterVec
	evicted *prometheus.CounterVec
	lost    *prometheus.CounterVec
	report  func(Eviction)

	ctx    context.Context // ends at Close: a write in progress gives up
	cancel context.CancelFunc
	subs   []*nats.Subscription
	wg     sync.WaitGroup // the lanes
	mu     sync.Mutex     // closed, lanes, and the sends to a lane's queue
	closed bool
	lanes  map[string]*lane // by DEAD subject
}

// OpenWriter subscribes to the advisories on cfg.Conn and writes the dead letter of each;
// ctx is the parent of every write, until Close.
func OpenWriter(ctx context.Context, cfg WriterConfig) (*Writer, error) {
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		cfg.Conn.Close()
		return nil, err
	}
	d := &Writer{log: cfg.Logger, nc: cfg.Conn, js: js, share: cfg.Share, written: cfg.Written, evicted: cfg.Evicted, lost: cfg.Lost,
		report: cfg.Report, lanes: map[string]*lane{}}
	d.ctx, d.cancel = context.WithCancel(ctx)
	for _, prefix := range []string{advisoryMaxDeliveries, advisoryTerminated} {
		sub, err := d.nc.Subscribe(prefix+".*.*", d.handle)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("subscribe %s: %w", prefix, err)
		}
		d.subs = append(d.subs, sub)
	}
	if err := d.nc.Flush(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Close ends the writer: writes in progress give up, the lanes are waited for, and the
// connection closes.
func (d *Writer) Close() error {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.cancel()
	for _, s := range d.subs {
		s.Unsubscribe()
	}
	d.wg.Wait()
	d.nc.Close()
	return nil
}

// handle hands one advisory's death to its consumer's lane. nats.go runs one subscription's
// handler at a time, so it never waits: a lane that is busy with an unwritable letter holds
// its own consumer's deaths, no other's.
func (d *Writer) handle(m *nats.Msg) {
	dd, err := readAdvisory(m.Data)
	if err != nil {
		d.log.Warn("unreadable consumer advisory", "subject", m.Subject, "err", err)
		return
	}
	if !d.enqueue(dd) {
		d.lose(dd, fmt.Sprintf("%d deaths of this consumer wait to be written already: it dies faster than DEAD takes its letters", laneQueue), nil)
	}
}

// take writes one death's letter, trying again while DEAD cannot store it for a while.
func (d *Writer) take(l *lane, dd death) {
	ctx, cancel := context.WithTimeout(d.ctx, deadWriteBudget)
	defer cancel()
	wait := backoff.Backoff{First: 200 * time.Millisecond, Max: 5 * time.Second}
	var err error
	for attempt := 1; ; attempt++ {
		err = d.write(ctx, l, dd)
		if err == nil || errors.Is(err, errNotDead) || errors.Is(err, errDeadFull) || errors.Is(err, errUnwritable) || ctx.Err() != nil {
			break
		}
		d.log.Debug("dead letter not written yet", "stream", dd.stream, "consumer", dd.consumer, "seq", dd.seq, "attempt", attempt, "err", err)
		wait.Wait(ctx) // an ended ctx ends the loop above
	}
	switch {
	case err == nil:
	case errors.Is(err, errNotDead):
		d.log.Warn("advisory not dead-lettered", "stream", dd.stream, "consumer", dd.consumer, "seq", dd.seq, "why", err)
	case errors.Is(err, errDeadFull):
		d.lose(dd, "DEAD is full; raise dead-max-bytes, or drop or replay dead letters (`meshnode dead ls`)", err)
	case errors.Is(err, errUnwritable):
		d.lose(dd, "DEAD cannot take it", err)
	case d.ctx.Err() == nil:
		d.lose(dd, "DEAD could not store it", err)
	}
}

// lose logs and counts a death whose letter is not written.
func (d *Writer) lose(dd death, why string, err error) {
	d.lost.WithLabelValues(dd.stream, dd.consumer).Inc()
	d.log.Error("dead letter lost: "+why, "stream", dd.stream, "consumer", dd.consumer, "seq", dd.seq,
		"deliveries", dd.deliveries, "reason", dd.reason, "err", err)
}

// errDeadFull means DEAD refused the letter for its byte limit: retrying cannot help until an
// operator makes room.
var errDeadFull = errors.New("DEAD is full")

// errUnwritable marks a letter DEAD can never take: larger than a consumer's share, or than
// the bus's largest message.
var errUnwritable = errors.New("the letter cannot be written")

// errNotDead marks an advisory that has no dead letter to write, for good: the message is
// gone, or not the consumer's.
var errNotDead = errors.New("nothing to dead-letter")

// readAdvisory decodes and checks one of the two advisories.
func readAdvisory(data []byte) (death, error) {
	var head server.TypedEvent
	if err := json.Unmarshal(data, &head); err != nil {
		return death{}, err
	}
	var d death
	switch head.Type {
	case server.JSConsumerDeliveryExceededAdvisoryType:
		var a server.JSConsumerDeliveryExceededAdvisory
		if err := json.Unmarshal(data, &a); err != nil {
			return death{}, err
		}
		d = death{stream: a.Stream, consumer: a.Consumer, seq: a.StreamSeq, deliveries: a.Deliveries, reason: reasonMaxDeliveries}
	case server.JSConsumerDeliveryTerminatedAdvisoryType:
		var a server.JSConsumerDeliveryTerminatedAdvisory
		if err := json.Unmarshal(data, &a); err != nil {
			return death{}, err
		}
		d = death{stream: a.Stream, consumer: a.Consumer, seq: a.StreamSeq, deliveries: a.Deliveries,
			reason: cleanReason(a.Reason), terminated: true}
		if d.reason == "" {
			d.reason = reasonTerminated
		}
	default:
		return death{}, fmt.Errorf("advisory type %q", head.Type)
	}
	if d.stream != manifest.EventsStreamName && !(d.workQueue() && manifest.ValidName(strings.TrimPrefix(d.stream, manifest.SeatStreamName("")))) {
		return death{}, fmt.Errorf("stream %q is not one of the mesh's consumed streams", d.stream)
	}
	if !subjectToken(d.consumer) || d.seq == 0 {
		return death{}, fmt.Errorf("consumer %q, sequence %d", d.consumer, d.seq)
	}
	return d, nil
}

// subjectToken reports whether s is one literal subject token.
func subjectToken(s string) bool {
	return s != "" && len(s) <= 255 && !strings.ContainsAny(s, ".*> \t\r\n")
}

// cleanReason makes a client's reason one header value: printable, one line, bounded.
func cleanReason(s string) string {
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if len(s) > maxDeadReason {
		cut := maxDeadReason
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// write stores one death in DEAD, within its consumer's share, then removes a work queue's
// message: the job leaves its queue only once its letter is stored (DESIGN §3).
func (d *Writer) write(ctx context.Context, l *lane, dd death) error {
	stream, err := d.js.Stream(ctx, dd.stream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("%w: stream %s is gone", errNotDead, dd.stream)
		}
		return err
	}
	msg, err := stream.GetMsg(ctx, dd.seq)
	var rawHeaders []byte
	if errors.Is(err, nats.ErrBadHeaderMsg) {
		// A client that is not nats.go can store a header block nats.go cannot decode: the
		// consumer gave it up, and it must still reach DEAD, with its raw header block.
		msg, rawHeaders, err = d.getRaw(ctx, dd)
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// Another node stored it and removed it from its work queue, a Term removed it from
		// one, or it aged out.
		return fmt.Errorf("%w: message %d is no longer in %s", errNotDead, dd.seq, dd.stream)
	}
	if err != nil {
		return err
	}
	if err := d.checkFilter(ctx, dd, msg.Subject); err != nil {
		return err
	}
	// A replay that dies again is recorded under the event's original subject, so it can be
	// replayed again to the same consumer.
	h := deadHeaders(msg.Header, dd, manifest.Original(msg.Subject))
	if rawHeaders != nil {
		h.Set(envelope.DeadReason, cleanReason("malformed headers (kept whole, base64, in "+envelope.DeadRawHeaders+"): "+dd.reason))
		h.Set(envelope.DeadRawHeaders, base64.StdEncoding.EncodeToString(rawHeaders))
	}
	letter := &nats.Msg{Subject: manifest.DeadSubject(dd.stream, dd.consumer), Header: h, Data: msg.Data}
	size := letterSize(letter.Subject, letter.Header, letter.Data)
	if wire := size - storeOverhead - int64(len(letter.Subject)); wire > d.nc.MaxPayload() {
		return fmt.Errorf("%w: a letter of %s is over the bus's largest message, %s: keep max-event-bytes a few KiB under it, so that every event fits in a letter",
			errUnwritable, manifest.Size(wire), manifest.Size(d.nc.MaxPayload()))
	}
	if d.share > 0 && size > d.share {
		return fmt.Errorf("%w: a letter of %s is larger than a consumer's share of DEAD, %s: raise dead-max-bytes-per-consumer",
			errUnwritable, manifest.Size(size), manifest.Size(d.share))
	}
	if err := d.makeRoom(ctx, l, size); err != nil {
		return err
	}
	ack, err := d.js.PublishMsg(ctx, letter)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && server.ErrorIdentifier(apiErr.ErrorCode) == server.JSStreamStoreFailedF && d.deadFull(ctx, len(msg.Data)) {
		// 10077 is any store failure (a closed store after a leader change is worth a
		// retry): DEAD's own state tells a full stream.
		return fmt.Errorf("%w: %s", errDeadFull, apiErr.Description)
	}
	if err != nil {
		return fmt.Errorf("write DEAD: %w", err)
	}
	l.wrote(ack.Sequence, size) // a duplicate too: another node's write, maybe after the ledger was read
	if !ack.Duplicate {
		d.written.WithLabelValues(dd.stream, dd.consumer).Inc()
		// A consumer with letters shows its evictions and losses too, zero until it has some:
		// a rate over a series that appears only at its first increment misses that one.
		d.evicted.WithLabelValues(dd.stream, dd.consumer).Add(0)
		d.lost.WithLabelValues(dd.stream, dd.consumer).Add(0)
		d.log.Warn("dead-lettered", "stream", dd.stream, "consumer", dd.consumer, "subject", h.Get(envelope.DeadSubject), "seq", dd.seq,
			"event", h.Get(envelope.EventID), "deliveries", dd.deliveries, "reason", dd.reason, "dead_seq", ack.Sequence)
	}
	if !dd.workQueue() {
		return nil // EVENTS keeps every event for every consumer until it ages out
	}
	if err := stream.DeleteMsg(ctx, dd.seq); err != nil {
		if _, gerr := stream.GetMsg(ctx, dd.seq); !errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("dead letter stored, but the job stays in %s: %w", dd.stream, err)
		}
	}
	return nil
}

// deadFull reports whether DEAD has no room for a letter of about size bytes.
func (d *Writer) deadFull(ctx context.Context, size int) bool {
	s, err := d.js.Stream(ctx, manifest.DeadStreamName)
	if err != nil {
		return false
	}
	info := s.CachedInfo()
	return info.Config.MaxBytes > 0 && int64(info.State.Bytes)+int64(size) >= info.Config.MaxBytes
}

// getRaw reads a message whose header block does not decode: its subject and body, with no
// headers, and the header block as stored.
func (d *Writer) getRaw(ctx context.Context, dd death) (*jetstream.RawStreamMsg, []byte, error) {
	req, _ := json.Marshal(map[string]uint64{"seq": dd.seq})
	m, err := d.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+dd.stream, req)
	if err != nil {
		return nil, nil, err
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message struct {
			Subject string `json:"subject"`
			Header  []byte `json:"hdrs"`
			Data    []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, nil, fmt.Errorf("read message %d of %s: %w", dd.seq, dd.stream, err)
	}
	if resp.Error != nil {
		if resp.Error.Code == int(jetstream.JSErrCodeMessageNotFound) {
			return nil, nil, jetstream.ErrMsgNotFound
		}
		return nil, nil, fmt.Errorf("read message %d of %s: %s", dd.seq, dd.stream, resp.Error.Description)
	}
	raw := resp.Message.Header
	if raw == nil {
		raw = []byte{}
	}
	return &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: dd.seq, Header: nats.Header{}, Data: resp.Message.Data}, raw, nil
}

// checkFilter refuses a message the consumer does not deliver: a Term names any sequence.
// MaxDeliver's advisory comes from the server about a message it delivered; it is written even
// when the consumer is gone since.
func (d *Writer) checkFilter(ctx context.Context, dd death, subject string) error {
	c, err := d.js.Consumer(ctx, dd.stream, dd.consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		if dd.terminated {
			return fmt.Errorf("%w: consumer %s > %s is gone: its filter cannot be checked", errNotDead, dd.stream, dd.consumer)
		}
		return nil
	}
	if err != nil {
		return err
	}
	cfg := c.CachedInfo().Config
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = append(filters, cfg.FilterSubject)
	}
	if len(filters) == 0 {
		return nil
	}
	for _, f := range filters {
		if manifest.Matches(f, subject) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is not delivered by consumer %s > %s (a forged +TERM?)", errNotDead, subject, dd.stream, dd.consumer)
}

// deadHeaders are the dead letter's headers: the original's, less any the broker would act
// on (Nats-*) or that could pass for the node's own (x-dead-*), plus the node's record of
// the death.
func deadHeaders(orig nats.Header, dd death, subject string) nats.Header {
	h := nats.Header{}
	for k, v := range orig {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "nats-") || strings.HasPrefix(lk, "x-dead-") {
			continue
		}
		h[k] = append([]string(nil), v...)
	}
	h.Set(envelope.DeadReason, dd.reason)
	h.Set(envelope.DeadDeliveries, strconv.FormatUint(dd.deliveries, 10))
	h.Set(envelope.DeadSubject, subject)
	h.Set(envelope.DeadConsumer, dd.consumer)
	h.Set(envelope.DeadStream, dd.stream)
	h.Set(nats.MsgIdHdr, dd.id())
	return h
}
