package registry

import (
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
)

// The registry's outbox (issue 12): a registration or a removal and its event are one write.
// The event is stored in the module's record with the change and published after it; the
// controller removes it from the record once EVENTS acknowledged it. A removal first leaves a
// record marked Removed — to the mirror the module is gone at once — holding its event, and
// the record is deleted once the event is out. A controller killed between the two leaves
// the event in the record, and the next controller publishes it.

// The events of the registry, published as the acting node's own (mesh.node.<node>.event.…).
const (
	EventRegistered = "module.registered"
	EventRemoved    = "module.removed"
)

// MaxOutbox bounds the events one record keeps waiting: past it, the controller refuses
// changes to that module rather than store them without their events.
const MaxOutbox = 64

// OutboxEvent is an event waiting in a record to be published.
type OutboxEvent struct {
	ID     string          `json:"id"`
	Action string          `json:"action"` // EventRegistered or EventRemoved
	Node   string          `json:"node"`   // the node that made the change
	Body   json.RawMessage `json:"body"`
}

// NewOutboxEvent returns the event of a change node made, with its id fixed now.
func NewOutboxEvent(action, node string, body map[string]any) (OutboxEvent, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return OutboxEvent{}, err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return OutboxEvent{}, err
	}
	return OutboxEvent{ID: id.String(), Action: action, Node: node, Body: b}, nil
}

// checkOutbox checks a record's waiting events, read from the bucket: untrusted input.
func checkOutbox(events []OutboxEvent) error {
	if len(events) > MaxOutbox {
		return fmt.Errorf("the record holds %d waiting events, more than %d", len(events), MaxOutbox)
	}
	for _, e := range events {
		if _, err := envelope.ParseID(e.ID); err != nil {
			return fmt.Errorf("a waiting event: %w", err)
		}
		if e.Action != EventRegistered && e.Action != EventRemoved {
			return fmt.Errorf("a waiting event's action %.40q is not one of the registry's", e.Action)
		}
		if !manifest.ValidName(e.Node) {
			return fmt.Errorf("a waiting event's node %.40q is not a name", e.Node)
		}
		var body map[string]any
		if json.Unmarshal(e.Body, &body) != nil {
			return fmt.Errorf("a waiting event's body is not a JSON object")
		}
	}
	return nil
}

// Pending returns the modules whose record holds events not yet published: registered ones,
// and removed ones whose record waits for its event before it is deleted.
func (r *Registry) Pending() []*Entry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*Entry
	for _, e := range r.byModule {
		if len(e.Outbox) > 0 {
			out = append(out, e)
		}
	}
	for _, e := range r.leaving {
		out = append(out, e)
	}
	return out
}

// Leaving returns the record of a removed module that waits for its event to be published.
func (r *Registry) Leaving(name string) (*Entry, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.leaving[name]
	return e, ok
}
