package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/manifest"
)

// floors remembers how far each module's EVENTS consumer had acked, so that one deleted
// under its module (drift) is made again where it stood: a consumer is DeliverNew when first
// made, and made again so it would skip every event its module had not yet handled — the
// chaos harness lost the first second of a module's events that way. Made again after its
// floor, the events since are delivered again (at least once: a module's dedup keeps its
// handler from running twice on the recent ones).
type floors struct {
	mu sync.Mutex
	at map[string]uint64 // consumer name → stream sequence acked up to
}

// note records what info says of its consumer. A clustered consumer reports an ack floor of
// 0 until it writes its first state (nats-server takes the floor from its store): one just
// made again after its floor would have noted 0, and been made again from the stream's first
// event the next time — the Node.js module in the 30-minute fault run then handled its whole
// history a second time. So a floor of 0 is read as "nothing acked since it was made": the
// floor is where it was made to start, or what was noted before, whichever is further.
func (f *floors) note(info *jetstream.ConsumerInfo) {
	if info == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == nil {
		f.at = map[string]uint64{}
	}
	floor := info.AckFloor.Stream
	if floor == 0 {
		if info.NumAckPending == 0 {
			floor = info.Delivered.Stream // its leader's start, before it has state
		}
		if c := info.Config; c.DeliverPolicy == jetstream.DeliverByStartSequencePolicy && c.OptStartSeq > 0 {
			floor = max(floor, c.OptStartSeq-1)
		}
		floor = max(floor, f.at[info.Name])
		if floor == 0 {
			return // nothing known: made again, it starts as a new one does
		}
	}
	f.at[info.Name] = floor
}

func (f *floors) get(name string) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.at[name]
	return at, ok
}

// EventsConsumers lists the consumers of EVENTS, remembering each one's ack floor: the
// controller's drift check lists them this way, so that one deleted is made again where it
// stood. It returns their names.
func (t *Topology) EventsConsumers(ctx context.Context) (map[string]bool, error) {
	s, err := t.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	l := s.ListConsumers(ctx)
	for info := range l.Info() {
		out[info.Name] = true
		t.floors.note(info)
	}
	return out, l.Err()
}

// ensureEventsConsumer creates or updates a module's EVENTS consumer. One that was known and
// is missing now starts after its last known ack floor, not at the stream's end.
func (t *Topology) ensureEventsConsumer(ctx context.Context, c manifest.Consumer, missing bool) error {
	cfg := consumerConfig(c)
	if floor, ok := t.floors.get(c.Name); ok && missing && t.holds(ctx, c.Stream, floor) {
		again := cfg
		again.DeliverPolicy, again.OptStartSeq = jetstream.DeliverByStartSequencePolicy, floor+1
		cons, err := t.js.CreateConsumer(ctx, c.Stream, again)
		if err == nil {
			t.floors.note(cons.CachedInfo())
			return nil
		}
		if !errors.Is(err, jetstream.ErrConsumerExists) {
			return err
		}
	}
	cons, err := t.js.CreateOrUpdateConsumer(ctx, c.Stream, cfg)
	if err != nil {
		// One made again after its floor keeps where it started: JetStream cannot change a
		// consumer's deliver policy, and where it starts matters only when it is made.
		old, oerr := t.js.Consumer(ctx, c.Stream, c.Name)
		if oerr != nil {
			// The lookup's own error decides whether the whole step is tried again: a node
			// restarted after a full disk timed out here on its first attempt, and exited
			// on the refusal it could not explain.
			return fmt.Errorf("look up consumer %s to keep where it starts (its update was refused: %v): %w", c.Name, err, oerr)
		}
		if old.CachedInfo().Config.DeliverPolicy == cfg.DeliverPolicy {
			return err
		}
		was := old.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = was.DeliverPolicy, was.OptStartSeq, was.OptStartTime
		if cons, err = t.js.CreateOrUpdateConsumer(ctx, c.Stream, cfg); err != nil {
			return err
		}
	}
	t.floors.note(cons.CachedInfo())
	return nil
}

// holds reports whether stream has reached sequence seq: a floor noted on a stream deleted
// and made again since would otherwise skip the new stream's events up to it.
func (t *Topology) holds(ctx context.Context, stream string, seq uint64) bool {
	s, err := t.js.Stream(ctx, stream)
	return err == nil && s.CachedInfo().State.LastSeq >= seq
}

// EventsConsumerNames lists the consumers of EVENTS by name only: what a node that does not
// hold the controller's seat needs to see one missing.
func (t *Topology) EventsConsumerNames(ctx context.Context) (map[string]bool, error) {
	s, err := t.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	l := s.ConsumerNames(ctx)
	for name := range l.Name() {
		out[name] = true
	}
	return out, l.Err()
}

// StreamNames lists the account's streams.
func (t *Topology) StreamNames(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	l := t.js.StreamNames(ctx)
	for name := range l.Name() {
		out[name] = true
	}
	return out, l.Err()
}
