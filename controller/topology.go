package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// The controller is the only writer of stream and consumer definitions (DESIGN §3): every
// definition comes from manifest, and each function here is idempotent, so reconciling twice
// changes nothing.

// streamConfig turns a derived stream into JetStream's configuration.
func streamConfig(s manifest.Stream, replicas int) jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{
		Name:              s.Name,
		Subjects:          s.Subjects,
		Retention:         jetstream.LimitsPolicy,
		MaxAge:            s.MaxAge,
		MaxMsgsPerSubject: s.MaxMsgsPerSubject,
		Duplicates:        s.Duplicates,
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
	}
	if s.Retention == manifest.RetentionWorkQueue {
		cfg.Retention = jetstream.WorkQueuePolicy
	}
	if cfg.MaxMsgsPerSubject == 0 {
		cfg.MaxMsgsPerSubject = -1
	}
	return cfg
}

// consumerConfig turns a derived consumer into JetStream's configuration.
//
// The back-off is not handed to JetStream as BackOff: with BackOff set, the server measures a
// NAK's delay from BackOff[deliveries-1] minus the ack wait, so a client's "retry in 10ms"
// after a second failure waits 30s more (seen on nats-server 2.15.2). The ack wait is the
// first step, which is what redelivers the work of a crashed handler; the sdk applies the
// back-off to failed handlers itself, with NAK delays.
func consumerConfig(c manifest.Consumer) jetstream.ConsumerConfig {
	cfg := jetstream.ConsumerConfig{
		Durable:       c.Name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: c.MaxAckPending,
		MaxDeliver:    c.MaxDeliver,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if len(c.BackOff) > 0 {
		cfg.AckWait = c.BackOff[0]
	}
	if c.AckPolicy == manifest.AckAll {
		cfg.AckPolicy = jetstream.AckAllPolicy
	}
	if c.DeliverPolicy == manifest.DeliverNew {
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	if len(c.FilterSubjects) == 1 {
		cfg.FilterSubject = c.FilterSubjects[0]
	} else {
		cfg.FilterSubjects = c.FilterSubjects
	}
	return cfg
}

// Topology reconciles the mesh's streams and the consumers of registered modules.
type Topology struct {
	js           jetstream.JetStream
	node         string
	replicas     func() int // how many copies a stream is created with now
	eventsMaxAge time.Duration
	budget       Budget // byte limits; zero: none
	// auditFloor is the ack floor of the explicit audit consumer EnsureAudit is replacing,
	// kept until the new one is set back to it: an attempt that times out after the delete
	// leaves the next attempt a consumer that reads EVENTS from its start.
	auditFloor uint64
	auditMu    sync.Mutex // one EnsureAudit at a time (start-up, the controller, drift repair)
	floors     floors     // how far each module's EVENTS consumer had acked (floors.go)
	// sites are the mesh's sites (issue 42), whose SITE_EVENTS EVENTS sources; nil: none.
	sites func() []string
}

// streamConfig is the JetStream configuration of a derived stream on this mesh, within the
// node's store budget.
func (t *Topology) streamConfig(s manifest.Stream) jetstream.StreamConfig {
	cfg := streamConfig(s, t.replicas())
	t.budget.apply(&cfg, s)
	if s.Name == manifest.EventsStreamName && t.sites != nil {
		// A site's events reach EVENTS only this way: their subjects never cross its link.
		for _, site := range t.sites() {
			cfg.Sources = append(cfg.Sources, SiteSource(site))
		}
	}
	return cfg
}

// SiteSource is how EVENTS names a site's SITE_EVENTS among its sources: in the site's
// domain, through its durable consumer for the hub (site.SourceConsumer).
func SiteSource(site string) *jetstream.StreamSource {
	return &jetstream.StreamSource{Name: manifest.SiteEventsStreamName, Domain: manifest.SiteDomain(site),
		Consumer: &jetstream.StreamConsumerSource{Name: manifest.SiteSourceConsumer, DeliverSubject: manifest.SiteDeliverSubject(site)}}
}

// EnsureMesh creates or updates the streams every mesh has: EVENTS, STATE, DEAD (at once:
// in a cluster each waits for its own leader), and this node's audit consumer.
func (t *Topology) EnsureMesh(ctx context.Context) error {
	events := manifest.EventsStream()
	events.MaxAge = t.eventsMaxAge
	// JetStream refuses a duplicate window longer than the stream keeps its messages.
	events.Duplicates = min(events.Duplicates, max(events.MaxAge, time.Second))
	streams := []manifest.Stream{events, manifest.StateStream(), manifest.DeadStream()}
	g, gctx := errgroup.WithContext(ctx)
	for _, s := range streams {
		g.Go(func() error {
			if _, err := ensure.Stream(gctx, t.js, t.streamConfig(s)); err != nil {
				return fmt.Errorf("reconcile stream %s: %w", s.Name, storeFullError(s.Name, t.budget, err))
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return t.EnsureAudit(ctx)
}

// AuditConsumerConfig is JetStream's configuration of node's audit consumer
// (manifest.AuditConsumer): on EVENTS for a server, on SITE_EVENTS for a site.
func AuditConsumerConfig(node string) jetstream.ConsumerConfig {
	return consumerConfig(manifest.AuditConsumer(node))
}

// EnsureAudit creates or updates this node's audit consumer on EVENTS.
func (t *Topology) EnsureAudit(ctx context.Context) error {
	t.auditMu.Lock()
	defer t.auditMu.Unlock()
	audit := manifest.AuditConsumer(t.node)
	cfg := AuditConsumerConfig(t.node)
	_, err := t.js.CreateOrUpdateConsumer(ctx, audit.Stream, cfg)
	if err != nil {
		// A node of an earlier version acked each event on its own, and JetStream cannot
		// change a consumer's ack policy in place: the consumer is made again, and set back
		// to where the old one's acks had reached, so that the log neither reads EVENTS
		// again from its start nor skips what it had not acked. (A node stopped between the
		// delete and the reset reads EVENTS from its start once: the log's dedup index keeps
		// each event once.)
		old, oerr := t.js.Consumer(ctx, audit.Stream, audit.Name)
		if oerr != nil || old.CachedInfo().Config.AckPolicy == cfg.AckPolicy {
			return fmt.Errorf("reconcile consumer %s: %w", audit.Name, err)
		}
		t.auditFloor = max(t.auditFloor, old.CachedInfo().AckFloor.Stream)
		if err := t.js.DeleteConsumer(ctx, audit.Stream, audit.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("remake consumer %s with ack policy %s: %w", audit.Name, cfg.AckPolicy, err)
		}
		if _, err := t.js.CreateOrUpdateConsumer(ctx, audit.Stream, cfg); err != nil {
			return fmt.Errorf("remake consumer %s with ack policy %s: %w", audit.Name, cfg.AckPolicy, err)
		}
	}
	if t.auditFloor > 0 {
		if _, err := t.js.ResetConsumerToSequence(ctx, audit.Stream, audit.Name, t.auditFloor+1); err != nil {
			return fmt.Errorf("set consumer %s back to stream sequence %d: %w", audit.Name, t.auditFloor+1, err)
		}
		t.auditFloor = 0
	}
	return nil
}

// EnsureModule creates or updates everything d needs: its EVENTS consumer, and each seat's
// work queue and the seat consumer for this node.
func (t *Topology) EnsureModule(ctx context.Context, d *manifest.Derivation) error {
	return t.ensureModule(ctx, d, false)
}

// RepairModule is EnsureModule for a module whose EVENTS consumer went missing: made again,
// it starts where it had acked to, as far as the controller knows (EventsConsumers).
func (t *Topology) RepairModule(ctx context.Context, d *manifest.Derivation) error {
	return t.ensureModule(ctx, d, true)
}

func (t *Topology) ensureModule(ctx context.Context, d *manifest.Derivation, missing bool) error {
	if c := d.EventsConsumer; c != nil {
		if err := t.ensureEventsConsumer(ctx, *c, missing); err != nil {
			return fmt.Errorf("reconcile consumer %s on %s: %w", c.Name, c.Stream, err)
		}
	}
	for _, s := range d.Seats {
		if s.Stream == nil {
			continue
		}
		if _, err := ensure.Stream(ctx, t.js, t.streamConfig(*s.Stream)); err != nil {
			return fmt.Errorf("reconcile seat stream %s: %w", s.Stream.Name, storeFullError(s.Stream.Name, t.budget, err))
		}
		c, ok, err := d.SeatConsumer(s.Name, t.node)
		if err != nil || !ok {
			return err
		}
		if _, err := t.js.CreateOrUpdateConsumer(ctx, c.Stream, consumerConfig(c)); err != nil {
			return fmt.Errorf("reconcile seat consumer %s: %w", c.Name, err)
		}
	}
	return nil
}

// retire removes what old had and new (nil when the module is removed) no longer has. A
// seat's stream is deleted only when empty: queued work is never dropped, it waits for a
// module that declares the seat again. kept names the streams that stay for their backlog.
func (t *Topology) retire(ctx context.Context, old, new *manifest.Derivation) (kept []string, err error) {
	if c := old.EventsConsumer; c != nil && (new == nil || new.EventsConsumer == nil) {
		if err := t.js.DeleteConsumer(ctx, c.Stream, c.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("delete consumer %s: %w", c.Name, err)
		}
	}
	for _, s := range old.Seats {
		if s.Stream == nil || (new != nil && hasSeatStream(new, s.Name)) {
			continue
		}
		stream, err := t.js.Stream(ctx, s.Stream.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return kept, fmt.Errorf("look up %s: %w", s.Stream.Name, err)
		}
		if n := stream.CachedInfo().State.Msgs; n > 0 {
			kept = append(kept, fmt.Sprintf("%s keeps %d queued jobs for seat %s", s.Stream.Name, n, s.Name))
			continue
		}
		if err := t.js.DeleteStream(ctx, s.Stream.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return kept, fmt.Errorf("delete %s: %w", s.Stream.Name, err)
		}
	}
	return kept, nil
}

func hasSeatStream(d *manifest.Derivation, seat string) bool {
	for _, s := range d.Seats {
		if s.Name == seat && s.Stream != nil {
			return true
		}
	}
	return false
}

// RedeliverNow readies a seat's consumer for a new holder: it is kept, with its delivery
// counts, so a job that kills every holder in turn still dies after MaxDeliver (a consumer
// recreated per holder would start each job's count again). What the previous holder took
// and did not ack is NAKed on its behalf, as the holder itself would, so the new holder gets
// it at once instead of after the ack wait. The server takes a NAK for a message it has
// pending and a consumer sequence between the ack floor and the last delivery
// (consumer.go processNak on nats-server 2.15.2); the consumer's filter finds the messages,
// since a work queue keeps only what is not acked.
func (t *Topology) RedeliverNow(ctx context.Context, c manifest.Consumer) error {
	cons, err := t.js.CreateOrUpdateConsumer(ctx, c.Stream, consumerConfig(c))
	if err != nil {
		return fmt.Errorf("reconcile consumer %s: %w", c.Name, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("look up consumer %s: %w", c.Name, err)
	}
	if info.NumAckPending == 0 {
		return nil
	}
	stream, err := t.js.Stream(ctx, c.Stream)
	if err != nil {
		return fmt.Errorf("look up %s: %w", c.Stream, err)
	}
	nc := t.js.Conn()
	for _, filter := range c.FilterSubjects {
		for seq := info.AckFloor.Stream + 1; seq <= info.Delivered.Stream; {
			m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return fmt.Errorf("read %s from %d: %w", c.Stream, seq, err)
			}
			if m.Sequence > info.Delivered.Stream {
				break
			}
			if err := nc.Publish(ackSubject(c.Stream, c.Name, m.Sequence, info.Delivered.Consumer), []byte("-NAK")); err != nil {
				return err
			}
			seq = m.Sequence + 1
		}
	}
	return nc.FlushWithContext(ctx)
}

// ackSubject is a message's ack subject as JetStream writes it (version 1: $JS.ACK.<stream>.
// <consumer>.<deliveries>.<stream seq>.<consumer seq>.<time>.<pending>); a NAK reads only the
// two sequences.
func ackSubject(stream, consumer string, seq, consumerSeq uint64) string {
	return fmt.Sprintf("$JS.ACK.%s.%s.1.%d.%d.%d.0", stream, consumer, seq, consumerSeq, time.Now().UnixNano())
}
