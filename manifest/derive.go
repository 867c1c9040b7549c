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
	// Pins are the later protocol versions the module is pinned to, by seat (the registry
	// records them; `meshnode seat pin`): its uses and its consumes of the seat's events by
	// name speak that version. A seat not listed is spoken at v1.
	Pins map[string]string `json:"pins,omitempty"`

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
	// Version is, for a seat's verb, event or tool, the protocol version it belongs to; ""
	// for v1.
	Version string `json:"version,omitempty"`
	// CoveredBy is, for a consumed pattern covered by another of the same module, that
	// pattern: the consumer filters on it alone.
	CoveredBy string `json:"covered_by,omitempty"`
}

// Use is one seat a module uses: it may send work to the seat and call its tools, and
// nothing else.
type Use struct {
	// Seat is the seat's name.
	Seat string `json:"seat"`
	// Version is the protocol version the module speaks to the seat: v1 unless pinned.
	Version string `json:"version"`
	// Publish are the seat's accept subjects, mesh- and node-scoped: whichever the seat is;
	// none for the mesh's own seats, whose work only the nodes send (a builder module's own
	// mesh-build-machine aside).
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
	// Backlog is the most the backlog holds as declared; the stream's MaxBytes is its value.
	Backlog string `json:"backlog,omitempty"`
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

// Derive validates m and derives everything the mesh makes of it, speaking v1 of every seat.
// The error is Refusals.
func (m *Manifest) Derive() (*Derivation, error) { return m.DeriveWith(nil) }

// DeriveWith is Derive for a module pinned to later versions of seats (pins: seat →
// version, as the registry records them). A pin names a seat the module uses or consumes
// events of by name, and a version v2 … v9 (v1 is no pin); whether the seat declares that
// version is the registry's question.
func (m *Manifest) DeriveWith(pins map[string]string) (*Derivation, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	pins, err := m.checkPins(pins)
	if err != nil {
		return nil, err
	}
	return derive(m, pins), nil
}

// ErrPin means a pin names a seat the module does not speak to, or no version a seat can
// declare.
var ErrPin = errors.New("invalid pin")

// checkPins returns pins without v1 entries (nil when none is left), or ErrPin.
func (m *Manifest) checkPins(pins map[string]string) (map[string]string, error) {
	var out map[string]string
	for _, seat := range sortedKeys(pins) {
		version := NormalVersion(pins[seat])
		if version == V1 {
			continue
		}
		if !validVersion(version) {
			return nil, fmt.Errorf("%w: version %q of seat %s is none of v1 … v%d", ErrPin, version, seat, MaxVersion)
		}
		if !m.SpeaksTo(seat) {
			return nil, fmt.Errorf("%w: module %s neither uses seat %s nor consumes its events by name", ErrPin, m.Module, seat)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[seat] = version
	}
	return out, nil
}

// SpeaksTo reports whether m uses seat or consumes its events by the seat's name: whether a
// version of the seat's protocol is m's to pin.
func (m *Manifest) SpeaksTo(seat string) bool {
	return slices.Contains(m.Uses, seat) || slices.ContainsFunc(m.Consumes, func(c string) bool {
		s, ok := ConsumedSeat(c)
		return ok && s == seat
	})
}

// ConsumedSeat returns the seat a consumes pattern names literally (seat.<seat>.<event…>);
// ok is false for any other pattern, seat.*.… included.
func ConsumedSeat(pattern string) (string, bool) {
	parts := strings.SplitN(pattern, ".", 3)
	if len(parts) < 3 || parts[0] != SeatEventsPrefix || parts[1] == "*" || parts[1] == "**" {
		return "", false
	}
	return parts[1], true
}

// consumeSubject is ConsumeSubject for a module with pins: a seat's events consumed by name
// are those of the pinned version.
func consumeSubject(pattern string, pins map[string]string) string {
	subject, _ := ConsumeSubject(pattern)
	if seat, ok := ConsumedSeat(pattern); ok && pins[seat] != "" {
		return strings.Replace(subject, "mesh.seat."+seat+".event.", "mesh.seat."+seat+"."+pins[seat]+".event.", 1)
	}
	return subject
}

// coversConsumed reports whether the consumed subject a covers b; ** (AllEvents) covers
// every version's events, as its consumer's filters do.
func coversConsumed(a, b string) bool {
	if a == AllEvents {
		return slices.ContainsFunc(EventPatterns(), func(p string) bool { return covers(p, b) })
	}
	return covers(a, b)
}

func derive(m *Manifest, pins map[string]string) *Derivation {
	d := &Derivation{
		Module:      m.Module,
		Bus:         m.requiresBus(),
		Emits:       []Derived{},
		Consumes:    []Derived{},
		Tools:       []Derived{},
		Uses:        []Use{},
		Seats:       []SeatDerivation{},
		Permissions: modulePermissions(m, pins),
		Secrets:     slices.Clone(m.Secrets),
		Pins:        pins,
		seats:       m.Seats,
	}
	if d.Bus {
		d.Inbox = InboxPrefix(m.Module)
	}
	for _, e := range m.Emits {
		d.Emits = append(d.Emits, Derived{Name: e, Subject: EventSubject(m.Module, e)})
	}
	for _, c := range m.Consumes {
		d.Consumes = append(d.Consumes, Derived{Name: c, Subject: consumeSubject(c, pins)})
	}
	var filters []string
	for i := range d.Consumes {
		c := &d.Consumes[i]
		for j, o := range d.Consumes {
			if j != i && coversConsumed(o.Subject, c.Subject) && !(o.Subject == c.Subject && j > i) {
				c.CoveredBy = o.Name
				break
			}
		}
		if c.CoveredBy == "" {
			filters = append(filters, c.Subject)
			if c.Subject == AllEvents {
				filters = append(filters, VersionedEvents()...)
			}
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
		v := NormalVersion(pins[s])
		u := Use{Seat: s, Version: v, Publish: []string{}, Request: []string{}}
		if m.sendsWork(s) {
			u.Publish = []string{seatAcceptAll(s, v), seatNodeAcceptAll(s, v)}
		}
		if !strings.HasPrefix(s, reservedSeatPrefix) {
			u.Request = []string{seatToolAll(s, v)} // the mesh's own seats' tools are the operator's
		}
		d.Uses = append(d.Uses, u)
	}
	for _, s := range m.Seats {
		d.Seats = append(d.Seats, deriveSeat(m.Module, s, NodePlaceholder))
	}
	return d
}

func deriveSeat(module string, s Seat, node string) SeatDerivation {
	sd := SeatDerivation{
		Name:        s.Name,
		Scope:       s.Scope,
		Retain:      s.Retain,
		Backlog:     s.Backlog,
		Accepts:     []Derived{},
		Emits:       []Derived{},
		Serves:      []Derived{},
		Holder:      holderPermissions(module, s, node),
		Fingerprint: Fingerprint(s),
	}
	for _, at := range s.each() {
		version := at.name
		if version == V1 {
			version = ""
		}
		for _, a := range at.seat.Accepts {
			subject := SeatAcceptSubjectAt(s.Name, at.name, a)
			if s.Scope == ScopeNode {
				subject = SeatNodeAcceptSubjectAt(s.Name, at.name, node, a)
			}
			sd.Accepts = append(sd.Accepts, Derived{Name: a, Subject: subject, Version: version})
		}
		for _, e := range at.seat.Emits {
			sd.Emits = append(sd.Emits, Derived{Name: e, Subject: SeatEventSubjectAt(s.Name, at.name, e), Version: version})
		}
		for _, v := range at.seat.Serves {
			sd.Serves = append(sd.Serves, Derived{Name: v, Subject: SeatToolSubjectAt(s.Name, at.name, v), Queue: s.Name, Version: version})
		}
	}
	if s.AcceptsWork() {
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
	return holderPermissions(d.Module, s, node), nil
}

// SeatConsumer returns the consumer the holder of seat on node pulls; ok is false when the
// seat accepts nothing and so has no work queue. Node matters only for a node-scoped seat.
func (d *Derivation) SeatConsumer(seat, node string) (c Consumer, ok bool, err error) {
	s, err := d.seat(seat, node)
	if err != nil || !s.AcceptsWork() {
		return Consumer{}, false, err
	}
	return seatConsumer(s, node), true, nil
}
