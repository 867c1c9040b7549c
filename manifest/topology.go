package manifest

import (
	"bytes"
	"encoding/json"
	"time"
)

// Retention says when a stream lets go of a message.
type Retention string

// The retention kinds of derived streams.
const (
	// RetentionLimits keeps messages until a limit (age, count, size) evicts them.
	RetentionLimits Retention = "limits"
	// RetentionWorkQueue keeps a message until a consumer acks it.
	RetentionWorkQueue Retention = "workqueue"
)

// AckPolicy says how a consumer's messages are acknowledged.
type AckPolicy string

// The ack policies of derived consumers.
const (
	// AckExplicit is the ack policy of every module's and seat's consumer: each message is
	// acked on its own, after the handler has done its work.
	AckExplicit AckPolicy = "explicit"
	// AckAll is the audit consumer's: one ack, of the last event of a batch the log wrote,
	// acks every event before it in the stream.
	AckAll AckPolicy = "all"
)

// DeliverPolicy says where a new consumer starts in its stream.
type DeliverPolicy string

// The deliver policies of derived consumers.
const (
	// DeliverAll starts at the first message the stream holds: a seat's backlog, the
	// audit log's every event.
	DeliverAll DeliverPolicy = "all"
	// DeliverNew starts at the first message after the consumer is created: a module
	// registered today reacts to what happens from now on, and does not replay a week of
	// other modules' history as if it were news.
	DeliverNew DeliverPolicy = "new"
)

// Defaults of the mesh's streams and consumers (DESIGN §3). The controller may override a
// stream's limits from its configuration; the consumer defaults are the mesh's contract.
const (
	// DefaultEventsMaxAge is how long EVENTS keeps an event.
	DefaultEventsMaxAge = 7 * 24 * time.Hour
	// DefaultDuplicateWindow is the broker's dedup window on Nats-Msg-Id (x-event-id).
	DefaultDuplicateWindow = 2 * time.Minute
	// DefaultDeadMaxAge is how long DEAD keeps a dead letter.
	DefaultDeadMaxAge = 30 * 24 * time.Hour
	// DefaultDeadMaxPerConsumer caps the dead letters kept per consumer (DEAD's subject is
	// per consumer): one module's flood of failures, or of forged +TERMs, pushes out its own
	// oldest letters, never another's.
	DefaultDeadMaxPerConsumer = 10_000

	// MaxAckPending is the prefetch of every derived consumer: how many messages may be
	// delivered and not yet acked.
	MaxAckPending = 32
	// MaxDeliver is how many times a message is delivered before it goes to DEAD.
	MaxDeliver = 5
	// The redelivery back-off, one step per redelivery (len < MaxDeliver, as JetStream
	// requires). JetStream takes the first step as the ack wait as well, so it is the
	// server's default ack wait: a handler has 30s to ack a first delivery.
	BackOff1 = 30 * time.Second
	BackOff2 = time.Minute
	BackOff3 = 5 * time.Minute
	BackOff4 = 15 * time.Minute
)

// BackOff returns the redelivery back-off of derived consumers: BackOff1 … BackOff4.
func BackOff() []time.Duration { return []time.Duration{BackOff1, BackOff2, BackOff3, BackOff4} }

// Stream is a stream definition the controller reconciles; it turns it into a
// jetstream.StreamConfig. Replicas and storage are the controller's: they depend on the
// mesh's size, not on a declaration.
type Stream struct {
	// Name is the stream's name: EVENTS, STATE, DEAD or SEAT_<seat>.
	Name string
	// Subjects are the subjects the stream captures.
	Subjects []string
	// Retention is RetentionLimits or RetentionWorkQueue.
	Retention Retention
	// MaxAge is how long a message is kept; 0 means no age limit.
	MaxAge time.Duration
	// MaxMsgsPerSubject caps the messages kept per subject; 0 means no cap.
	MaxMsgsPerSubject int64
	// Duplicates is the Nats-Msg-Id dedup window; 0 means the server's default.
	Duplicates time.Duration
	// MaxBytes is the most a seat's work queue keeps, from the seat's backlog; 0 means the
	// node sizes it (its default for a seat, or its share for EVENTS, STATE and DEAD).
	MaxBytes int64
}

// Consumer is a durable pull consumer definition the controller reconciles; it turns it into
// a jetstream.ConsumerConfig.
type Consumer struct {
	// Stream is the stream the consumer reads.
	Stream string
	// Name is the durable name.
	Name string
	// FilterSubjects are the consumer's filters, pairwise disjoint (JetStream refuses
	// overlapping filters with error 10138).
	FilterSubjects []string
	// DeliverPolicy is where a new consumer starts.
	DeliverPolicy DeliverPolicy
	// AckPolicy is AckExplicit, but AckAll for the audit consumer.
	AckPolicy AckPolicy
	// MaxAckPending is the prefetch: MaxAckPending.
	MaxAckPending int
	// MaxDeliver is the deliveries before a message goes to DEAD: MaxDeliver.
	MaxDeliver int
	// BackOff is the redelivery back-off; its first step is also the ack wait.
	BackOff []time.Duration
	// DeadSubject is where a message goes after MaxDeliver deliveries, before it is acked
	// or terminated: mesh.dead.<stream>.<consumer>.
	DeadSubject string
}

// EventsStream returns the definition of EVENTS: every event of modules, seats and nodes.
func EventsStream() Stream {
	return Stream{
		Name:      EventsStreamName,
		Subjects:  append(EventPatterns(), ReplayEvents),
		Retention: RetentionLimits,
		MaxAge:    DefaultEventsMaxAge,
		// No cap per subject: it evicted a subject's oldest events, audited or not, while the
		// audit log was behind. Each module's bytes are bounded before they are stored
		// instead (package admit), and nothing but age evicts an event.
		Duplicates: DefaultDuplicateWindow,
	}
}

// StateStream returns the definition of STATE: each node's declaration, last value per node.
// Writers set Nats-Expected-Last-Subject-Sequence, so a stale declaration is refused.
func StateStream() Stream {
	return Stream{
		Name:              StateStreamName,
		Subjects:          []string{"mesh.state.node.*"},
		Retention:         RetentionLimits,
		MaxMsgsPerSubject: 1,
	}
}

// DeadStream returns the definition of DEAD: every consumer's dead letters.
func DeadStream() Stream {
	return Stream{
		Name:              DeadStreamName,
		Subjects:          []string{"mesh.dead.*.*"},
		Retention:         RetentionLimits,
		MaxAge:            DefaultDeadMaxAge,
		MaxMsgsPerSubject: DefaultDeadMaxPerConsumer,
		// A letter's id is its death's: the dedup window spans the letter's life, so a
		// death told again (a +TERM a client may send for any message, at any time) is
		// stored once for as long as its letter is kept.
		Duplicates: DefaultDeadMaxAge,
	}
}

// SeatStreamName is the name of seat's work-queue stream: SEAT_<seat>.
func SeatStreamName(seat string) string { return "SEAT_" + seat }

// SeatConsumerName is the durable name of the consumer the holder of seat pulls: seat-<seat>,
// or seat-<seat>-<node> for a node-scoped seat's holder on node.
func SeatConsumerName(seat string, scope Scope, node string) string {
	if scope == ScopeNode {
		return "seat-" + seat + "-" + node
	}
	return "seat-" + seat
}

// AuditConsumer returns the definition of node's audit logger's consumer: audit-<node> on
// EVENTS, every event from the first one kept. It has no filter: EVENTS holds events and
// replays only, and an unfiltered consumer is the cheapest JetStream serves.
func AuditConsumer(node string) Consumer {
	c := newConsumer(EventsStreamName, "audit-"+node, nil, DeliverAll)
	// The audit log writes in batches and must never give up on an event: a wider window
	// than a module's prefetch, and no delivery limit (its failures are the node's own disk,
	// which a retry outlasts; a dead-lettered audit entry would be a hole in the record).
	c.MaxAckPending = AuditMaxAckPending
	c.MaxDeliver = -1
	c.DeadSubject = ""
	// A batch is written in milliseconds; a node killed mid-batch has its batch redelivered
	// after this, not after a module's 30 s.
	c.BackOff = []time.Duration{AuditAckWait}
	// One ack a batch, not one an event: the log writes in stream order and acks a batch
	// only once every event before its last is written (audit.Logger).
	c.AckPolicy = AckAll
	return c
}

// Audit consumer settings.
const (
	// AuditMaxAckPending is the audit consumer's window: how many events one batch may hold.
	AuditMaxAckPending = 4096
	// AuditAckWait is how long the audit logger has to commit and ack a batch.
	AuditAckWait = 5 * time.Second
)

func newConsumer(stream, name string, filters []string, deliver DeliverPolicy) Consumer {
	return Consumer{
		Stream:         stream,
		Name:           name,
		FilterSubjects: filters,
		DeliverPolicy:  deliver,
		AckPolicy:      AckExplicit,
		MaxAckPending:  MaxAckPending,
		MaxDeliver:     MaxDeliver,
		BackOff:        BackOff(),
		DeadSubject:    DeadSubject(stream, name),
	}
}

// seatStream derives the work-queue stream of a seat that accepts work: the accept subjects
// of each version that accepts any.
func seatStream(s Seat) Stream {
	var subjects []string
	for _, at := range s.each() {
		switch {
		case len(at.seat.Accepts) == 0:
		case s.Scope == ScopeNode:
			subjects = append(subjects, seatNodeAcceptAll(s.Name, at.name))
		default:
			subjects = append(subjects, seatAcceptAll(s.Name, at.name))
		}
	}
	maxAge, _ := ParseRetain(s.Retain)
	var maxBytes int64
	if s.Backlog != "" {
		maxBytes, _ = ParseBacklog(s.Backlog)
	}
	return Stream{
		Name:      SeatStreamName(s.Name),
		Subjects:  subjects,
		Retention: RetentionWorkQueue,
		MaxAge:    maxAge,
		MaxBytes:  maxBytes,
	}
}

// seatConsumer derives the consumer of a seat's holder on node (ignored for mesh scope): the
// work of every version, on that node for a node-scoped seat.
func seatConsumer(s Seat, node string) Consumer {
	var filters []string
	for _, at := range s.each() {
		switch {
		case len(at.seat.Accepts) == 0:
		case s.Scope == ScopeNode:
			filters = append(filters, seatNodeAccept(s.Name, at.name, node))
		default:
			filters = append(filters, seatAcceptAll(s.Name, at.name))
		}
	}
	return newConsumer(SeatStreamName(s.Name), SeatConsumerName(s.Name, s.Scope, node), filters, DeliverAll)
}

// MarshalJSON writes durations as Go duration strings ("168h0m0s"), for people and jq.
func (s Stream) MarshalJSON() ([]byte, error) {
	return marshalJSON(struct {
		Name              string    `json:"name"`
		Subjects          []string  `json:"subjects"`
		Retention         Retention `json:"retention"`
		MaxAge            string    `json:"max_age,omitempty"`
		MaxMsgsPerSubject int64     `json:"max_msgs_per_subject,omitempty"`
		Duplicates        string    `json:"duplicates,omitempty"`
	}{s.Name, s.Subjects, s.Retention, durationString(s.MaxAge), s.MaxMsgsPerSubject, durationString(s.Duplicates)})
}

// MarshalJSON writes durations as Go duration strings ("30s"), for people and jq.
func (c Consumer) MarshalJSON() ([]byte, error) {
	backOff := make([]string, len(c.BackOff))
	for i, d := range c.BackOff {
		backOff[i] = d.String()
	}
	return marshalJSON(struct {
		Stream         string        `json:"stream"`
		Name           string        `json:"name"`
		FilterSubjects []string      `json:"filter_subjects"`
		DeliverPolicy  DeliverPolicy `json:"deliver_policy"`
		AckPolicy      AckPolicy     `json:"ack_policy"`
		MaxAckPending  int           `json:"max_ack_pending"`
		MaxDeliver     int           `json:"max_deliver"`
		BackOff        []string      `json:"backoff"`
		DeadSubject    string        `json:"dead_subject"`
	}{c.Stream, c.Name, c.FilterSubjects, c.DeliverPolicy, c.AckPolicy, c.MaxAckPending, c.MaxDeliver, backOff, c.DeadSubject})
}

// marshalJSON marshals v without escaping <, > and &, which subjects and NodePlaceholder
// hold and which a reader would otherwise see as \u003e.
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

func durationString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// KVBucket is the key-value bucket the mesh provides module when it requires kv (its
// stream is KV_<bucket>): the module's alone.
func KVBucket(module string) string { return "mesh-kv-" + module }
