package manifest

import (
	"cmp"
	"slices"
	"strings"
)

// Permissions is what one bus connection may publish and subscribe to: allow lists only, with
// everything else denied. A later layer turns it into nats-server's server.Permissions: a
// Subscription with a queue becomes the allow entry "<subject> <queue>", and AllowResponses
// a ResponsePermission.
type Permissions struct {
	// Publish lists the subjects the connection may publish on (wildcards allowed).
	Publish []string `json:"publish"`
	// Subscribe lists the subscriptions the connection may make.
	Subscribe []Subscription `json:"subscribe"`
	// AllowResponses says the connection answers requests. Its answers go only where
	// Publish allows — the operator's inbox, and for a seat's holder its users' inboxes —
	// never to a reply subject a caller chose elsewhere: nats-server's response permission,
	// which would pass any reply subject past every allow and deny list, is not used.
	AllowResponses bool `json:"allow_responses"`
}

// Subscription is one subscribe allow entry.
type Subscription struct {
	// Subject is the subject the connection may subscribe on.
	Subject string `json:"subject"`
	// Queue, when set, is the only queue group the subscription may join, and a plain
	// subscription is refused; "" allows a plain subscription (and any queue).
	Queue string `json:"queue,omitempty"`
}

// Merge returns the union of p and q, sorted, without duplicates: how a caller adds a
// seat's holder permissions to a module's own while the instance holds the seat's lease.
func (p Permissions) Merge(q Permissions) Permissions {
	return Permissions{
		Publish:        append(slices.Clone(p.Publish), q.Publish...),
		Subscribe:      append(slices.Clone(p.Subscribe), q.Subscribe...),
		AllowResponses: p.AllowResponses || q.AllowResponses,
	}.normal()
}

// IsZero reports whether p allows nothing at all.
func (p Permissions) IsZero() bool {
	return len(p.Publish) == 0 && len(p.Subscribe) == 0 && !p.AllowResponses
}

// normal sorts and deduplicates p, so equal permission sets compare and print equal.
func (p Permissions) normal() Permissions {
	slices.Sort(p.Publish)
	p.Publish = slices.Compact(p.Publish)
	slices.SortFunc(p.Subscribe, func(a, b Subscription) int {
		return cmp.Or(strings.Compare(a.Subject, b.Subject), strings.Compare(a.Queue, b.Queue))
	})
	p.Subscribe = slices.Compact(p.Subscribe)
	if p.Publish == nil { // empty lists, not null, in JSON
		p.Publish = []string{}
	}
	if p.Subscribe == nil {
		p.Subscribe = []Subscription{}
	}
	return p
}

// modulePermissions derives what every instance of m may always do (DESIGN §5): publish its
// events, through the node's admitter (AdmitSubject); answer its tools in queue group <module>; reply to requests; subscribe on its
// inbox; pull and ack its EVENTS consumer; send work (through the admitter too) to and call
// the seats it uses — never subscribe on them. A module that does not require the bus gets nothing.
func modulePermissions(m *Manifest, pins map[string]string) Permissions {
	var p Permissions
	if !m.requiresBus() {
		return p
	}
	for _, e := range m.Emits {
		p.Publish = append(p.Publish, AdmitSubject(m.Module, EventSubject(m.Module, e)))
	}
	for _, t := range m.Tools {
		p.Subscribe = append(p.Subscribe, Subscription{Subject: ToolSubject(m.Module, t), Queue: m.Module})
	}
	if len(m.Tools) > 0 {
		// A module's own tools are the operator's to call: it answers into the operator's
		// inbox, and nowhere a caller could name instead.
		p.AllowResponses = true
		p.Publish = append(p.Publish, OperatorInbox+".>")
	}
	p.Subscribe = append(p.Subscribe, Subscription{Subject: InboxPrefix(m.Module) + ".>"})
	if m.answersCalls() {
		p.Publish = append(p.Publish, StatsSubject(m.Module, "*")) // its tools' latency, to its node
	}
	if len(m.Consumes) > 0 {
		p.Publish = append(p.Publish, pullPermissions(EventsStreamName, m.Module)...)
	}
	if slices.Contains(m.Requires, RequireKV) {
		p.Publish = append(p.Publish, kvPermissions(KVBucket(m.Module))...)
	}
	for _, s := range m.Uses {
		v := pins[s] // the version the module speaks: only that one's subjects
		if m.sendsWork(s) {
			p.Publish = append(p.Publish, AdmitSubject(m.Module, seatAcceptAll(s, v)), AdmitSubject(m.Module, seatNodeAcceptAll(s, v)))
		}
		if !strings.HasPrefix(s, reservedSeatPrefix) {
			// The mesh's own seats (controller, vault) serve the operator and the nodes: a
			// module may send work to them, never call their tools.
			p.Publish = append(p.Publish, seatToolAll(s, v))
		}
	}
	return p.normal()
}

// sendsWork reports whether m may send work to seat, which it uses. Any seat of a module's,
// but of the mesh's own only the one m holds itself (a builder module's mesh-build-machine):
// the mesh's seats take their work from the nodes — a host report is a node's apply outcome,
// a build job the controller's — and a module that could queue them would fill their work
// queues with jobs the holder can only refuse, one by one, after they are stored.
func (m *Manifest) sendsWork(seat string) bool {
	if !strings.HasPrefix(seat, reservedSeatPrefix) {
		return true
	}
	_, holds := m.Seat(seat)
	return holds && !slices.Contains(NodeHeldSeats, seat)
}

// answersCalls reports whether m answers tool calls: its own tools, or a seat's it may hold.
func (m *Manifest) answersCalls() bool {
	if len(m.Tools) > 0 {
		return true
	}
	return slices.ContainsFunc(m.Seats, Seat.ServesCalls)
}

// pullPermissions are the publish subjects needed to pull and ack one consumer. Never its
// dead subject: the node writes dead letters (from JetStream's advisories), and a client that
// could write DEAD could forge what `dead replay` republishes. A client gives up on a message
// by terminating it (+TERM with its reason), which its ack subject already allows.
// kvPermissions are what a client needs of one JetStream key-value bucket, and nothing of
// another: look it up, get, put, delete and purge keys. Not listing or watching keys: those
// make a consumer, and whoever may create a consumer names its delivery subject in the
// request's body, where no subject permission reaches — it could deliver its bucket's
// messages as requests to any tool of the mesh.
func kvPermissions(bucket string) []string {
	stream := "KV_" + bucket
	return []string{
		"$KV." + bucket + ".>",
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.API.DIRECT.GET." + stream + ".>",
	}
}

func pullPermissions(stream, consumer string) []string {
	return []string{
		consumerInfoSubject(stream, consumer),
		consumerNextSubject(stream, consumer),
		consumerAckSubject(stream, consumer),
	}
}

// holderPermissions derives what the holder of seat s on node adds while it holds the lease:
// pull and ack the seat's consumer, publish the seat's events, answer the
// seat's tools in queue group <seat> — of every version the seat declares.
func holderPermissions(module string, s Seat, node string) Permissions {
	var p Permissions
	if s.AcceptsWork() {
		c := SeatConsumerName(s.Name, s.Scope, node)
		p.Publish = append(p.Publish, pullPermissions(SeatStreamName(s.Name), c)...)
	}
	serves := false
	for _, at := range s.each() {
		for _, e := range at.seat.Emits {
			p.Publish = append(p.Publish, AdmitSubject(module, SeatEventSubjectAt(s.Name, at.name, e)))
		}
		for _, v := range at.seat.Serves {
			p.Subscribe = append(p.Subscribe, Subscription{Subject: SeatToolSubjectAt(s.Name, at.name, v), Queue: s.Name})
			serves = true
		}
	}
	if serves {
		// The seat's users and the operator call its tools: the operator's inbox here, the
		// users' where the bus knows them (the registry: see the node's directory).
		p.AllowResponses = true
		p.Publish = append(p.Publish, OperatorInbox+".>")
	}
	if len(s.Provides) > 0 {
		// A provisioner answers the controller's create, remove and holds there.
		p.Publish = append(p.Publish, ProvisionInbox+".>")
	}
	return p.normal()
}
