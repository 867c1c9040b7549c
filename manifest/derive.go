package manifest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Errors of deriving per-node parts for a seat.
var (
	// ErrUnknownSeat means the manifest declares no seat of that name.
	ErrUnknownSeat = errors.New("no such seat")
	// ErrInvalidNode means a node name is not a single valid name part, so it cannot be put
	// in a subject or consumer name without widening what it grants.
	ErrInvalidNode = errors.New("invalid node name")
)

// NodePlaceholder stands for the node's name in the node-scoped parts of a Derivation (a
// node-scoped seat's accept subjects, consumer and holder permissions), which differ per
// node. SeatConsumer and HolderPermissions derive them for a real node.
const NodePlaceholder = "<node>"

// Derivation is everything the mesh makes of a valid manifest: subjects, the seat streams and
// consumers, and permissions. Only Derive makes one, so holding one means the manifest
// passed Validate. Its JSON form is for people and tools to read: a Derivation decoded from
// JSON cannot derive per-node parts (HolderPermissions, SeatConsumer); derive again from the
// manifest.
type Derivation struct {
	// Module is the module's name.
	Module string `json:"module"`
	// Bus reports whether the module requires the mesh's bus, and so has an account.
	Bus bool `json:"bus"`
	// Inbox is the module's inbox prefix, _INBOX.<module>; "" without the bus.
	Inbox string `json:"inbox_prefix,omitempty"`
	// Emits are the module's events and their subjects.
	Emits []Derived `json:"emits"`
	// Consumes are the module's patterns and their subjects; CoveredBy marks a pattern
	// dropped from its consumer's filters.
	Consumes []Derived `json:"consumes"`
	// Tools are the module's tools, their subjects and queue group.
	Tools []Derived `json:"tools"`
	// Uses are the seats the module sends work to and what it may publish to each.
	Uses []Use `json:"uses"`
	// Seats are the seats the module declares.
	Seats []SeatDerivation `json:"seats"`
	// Secrets are the names of the secrets the module may fetch from the vault.
	Secrets []string `json:"secrets,omitempty"`
	// EventsConsumer is the module's durable consumer on EVENTS; nil when it consumes
	// nothing.
	EventsConsumer *Consumer `json:"events_consumer,omitempty"`
	// Permissions are what every instance of the module may always do. Add a seat's
	// HolderPermissions while an instance holds it.
	Permissions Permissions `json:"permissions"`

	seats []Seat
}

// Derived is one declared name and what the mesh derives for it.
type Derived struct {
	// Name is the name or pattern as declared.
	Name string `json:"name"`
	// Subject is the derived subject or subject pattern.
	Subject string `json:"subject"`
	// Queue is the queue group of a tool's subscription; "" otherwise.
	Queue string `json:"queue,omitempty"`
	// CoveredBy is, for a consumed pattern covered by another of the same module, that
	// pattern: the consumer filters on it alone.
	CoveredBy string `json:"covered_by,omitempty"`
}

// Use is one seat a module uses: it may send work to the seat and call its tools, and
// nothing else.
type Use struct {
	// Seat is the seat's name.
	Seat string `json:"seat"`
	// Publish are the seat's accept subjects, mesh- and node-scoped: whichever the seat is.
	Publish []string `json:"publish"`
	// Request are the seat's tool subjects.
	Request []string `json:"request"`
}

// SeatDerivation is what the mesh derives for one declared seat.
type SeatDerivation struct {
	// Name is the seat's name.
	Name string `json:"name"`
	// Scope is the seat's scope.
	Scope Scope `json:"scope"`
	// Retain is the backlog's retention as declared; the stream's MaxAge is its value.
	Retain string `json:"retain,omitempty"`
	// Accepts are the verbs and their work-queue subjects (node scope: for NodePlaceholder).
	Accepts []Derived `json:"accepts"`
	// Emits are the seat's events and their subjects.
	Emits []Derived `json:"emits"`
	// Serves are the seat's tools, their subjects and queue group.
	Serves []Derived `json:"serves"`
	// Stream is the seat's work queue; nil when the seat accepts nothing.
	Stream *Stream `json:"stream,omitempty"`
	// Consumer is the holder's consumer (node scope: for NodePlaceholder); nil when the
	// seat accepts nothing.
	Consumer *Consumer `json:"consumer,omitempty"`
	// Holder is what the holder adds while it holds the lease (node scope: for
	// NodePlaceholder).
	Holder Permissions `json:"holder_permissions"`
	// Fingerprint is the seat's protocol fingerprint.
	Fingerprint string `json:"fingerprint"`
}

// Derive validates m and derives everything the mesh makes of it. The error is Refusals.
func (m *Manifest) Derive() (*Derivation, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return derive(m), nil
}

func derive(m *Manifest) *Derivation {
	d := &Derivation{
		Module:      m.Module,
		Bus:         m.requiresBus(),
		Emits:       []Derived{},
		Consumes:    []Derived{},
		Tools:       []Derived{},
		Uses:        []Use{},
		Seats:       []SeatDerivation{},
		Permissions: modulePermissions(m),
		Secrets:     slices.Clone(m.Secrets),
		seats:       m.Seats,
	}
	if d.Bus {
		d.Inbox = InboxPrefix(m.Module)
	}
	for _, e := range m.Emits {
		d.Emits = append(d.Emits, Derived{Name: e, Subject: EventSubject(m.Module, e)})
	}
	for _, c := range m.Consumes {
		subject, _ := ConsumeSubject(c)
		d.Consumes = append(d.Consumes, Derived{Name: c, Subject: subject})
	}
	var filters []string
	for i := range d.Consumes {
		c := &d.Consumes[i]
		for j, o := range d.Consumes {
			if j != i && covers(o.Subject, c.Subject) {
				c.CoveredBy = o.Name
				break
			}
		}
		if c.CoveredBy == "" {
			filters = append(filters, c.Subject)
		}
	}
	if len(filters) > 0 {
		c := newConsumer(EventsStreamName, m.Module, append(filters, ReplayFilter(m.Module)), DeliverNew)
		d.EventsConsumer = &c
	}
	for _, t := range m.Tools {
		d.Tools = append(d.Tools, Derived{Name: t, Subject: ToolSubject(m.Module, t), Queue: m.Module})
	}
	for _, s := range m.Uses {
		u := Use{Seat: s, Publish: []string{seatAcceptAll(s), seatNodeAcceptAll(s)}, Request: []string{}}
		if !strings.HasPrefix(s, reservedSeatPrefix) {
			u.Request = []string{seatToolAll(s)} // the mesh's own seats' tools are the operator's
		}
		d.Uses = append(d.Uses, u)
	}
	for _, s := range m.Seats {
		d.Seats = append(d.Seats, deriveSeat(s, NodePlaceholder))
	}
	return d
}

func deriveSeat(s Seat, node string) SeatDerivation {
	sd := SeatDerivation{
		Name:        s.Name,
		Scope:       s.Scope,
		Retain:      s.Retain,
		Accepts:     []Derived{},
		Emits:       []Derived{},
		Serves:      []Derived{},
		Holder:      holderPermissions(s, node),
		Fingerprint: Fingerprint(s),
	}
	for _, a := range s.Accepts {
		subject := SeatAcceptSubject(s.Name, a)
		if s.Scope == ScopeNode {
			subject = SeatNodeAcceptSubject(s.Name, node, a)
		}
		sd.Accepts = append(sd.Accepts, Derived{Name: a, Subject: subject})
	}
	for _, e := range s.Emits {
		sd.Emits = append(sd.Emits, Derived{Name: e, Subject: SeatEventSubject(s.Name, e)})
	}
	for _, v := range s.Serves {
		sd.Serves = append(sd.Serves, Derived{Name: v, Subject: SeatToolSubject(s.Name, v), Queue: s.Name})
	}
	if len(s.Accepts) > 0 {
		st, c := seatStream(s), seatConsumer(s, node)
		sd.Stream, sd.Consumer = &st, &c
	}
	return sd
}

// seat returns the declared seat named name and checks node for it: a node-scoped seat
// needs a valid node name; a mesh-scoped one ignores it.
func (d *Derivation) seat(name, node string) (Seat, error) {
	for _, s := range d.seats {
		if s.Name != name {
			continue
		}
		if s.Scope == ScopeNode && !ValidName(node) {
			return Seat{}, fmt.Errorf("seat %s of module %s: %w %q", name, d.Module, ErrInvalidNode, node)
		}
		return s, nil
	}
	return Seat{}, fmt.Errorf("module %s: %w %q", d.Module, ErrUnknownSeat, name)
}

// HolderPermissions returns what an instance holding seat on node may do besides the
// module's own Permissions: pull and ack the seat's consumer, publish the seat's events,
// answer its tools. Node matters only for a node-scoped seat.
func (d *Derivation) HolderPermissions(seat, node string) (Permissions, error) {
	s, err := d.seat(seat, node)
	if err != nil {
		return Permissions{}, err
	}
	return holderPermissions(s, node), nil
}

// SeatConsumer returns the consumer the holder of seat on node pulls; ok is false when the
// seat accepts nothing and so has no work queue. Node matters only for a node-scoped seat.
func (d *Derivation) SeatConsumer(seat, node string) (c Consumer, ok bool, err error) {
	s, err := d.seat(seat, node)
	if err != nil || len(s.Accepts) == 0 {
		return Consumer{}, false, err
	}
	return seatConsumer(s, node), true, nil
}
