package registry

// isAction reports whether name is one of the registry's events.
func isAction(name string) bool {
	return name == EventRegistered || name == EventRemoved || name == EventPinned || name == EventDeployed || name == EventUndeployed ||
		name == EventProviderChosen
}

// The registry's outbox (package outbox): a registration or a removal and its event are one
// write. The event is stored in the module's record with the change and published after it;
// the controller removes it from the record once EVENTS acknowledged it. A removal first leaves a
// record marked Removed — to the mirror the module is gone at once — holding its event, and
// the record is deleted once the event is out. A controller killed between the two leaves
// the event in the record, and the next controller publishes it.

// The events of the registry, published as the acting node's own (mesh.node.<node>.event.…).
const (
	EventRegistered = "module.registered"
	EventRemoved    = "module.removed"
	// EventPinned: a module moved to another version of a seat's protocol (seat pin).
	EventPinned = "module.pinned"
	// EventDeployed and EventUndeployed: a module's deployment set or changed, and ended.
	EventDeployed   = "module.deployed"
	EventUndeployed = "module.undeployed"
	// EventProviderChosen: the seat that provides one of a module's required interfaces was
	// chosen (provisions pin).
	EventProviderChosen = "module.provider-chosen"
)

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
