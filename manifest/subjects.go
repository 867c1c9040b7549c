package manifest

import "strings"

// The subject grammar of DESIGN §2. A manifest never holds one of these: the functions below
// are the only place the grammar is spelled, so reorganising the subject space is a change
// here and nowhere in the catalogue. They format; they do not validate their arguments.

// AllEvents is the pattern of every event in the mesh, of modules, seats and nodes alike:
// the EVENTS stream's subjects and what consumes: ["**"] derives. The kind token is what
// keeps tool calls and work out of it.
const AllEvents = "mesh.*.*.event.>"

// The mesh's own streams.
const (
	// EventsStreamName is the name of the stream every event lands in.
	EventsStreamName = "EVENTS"
	// StateStreamName is the name of the stream of node declarations, last value per node.
	StateStreamName = "STATE"
	// DeadStreamName is the name of the dead-letter stream.
	DeadStreamName = "DEAD"
)

// EventSubject is where module emits event: mesh.mod.<module>.event.<event>.
func EventSubject(module, event string) string { return "mesh.mod." + module + ".event." + event }

// ToolSubject is where module answers tool: mesh.mod.<module>.tool.<tool>.
func ToolSubject(module, tool string) string { return "mesh.mod." + module + ".tool." + tool }

// SeatAcceptSubject is the work queue of a mesh-scoped seat's verb:
// mesh.seat.<seat>.accept.<verb>.
func SeatAcceptSubject(seat, verb string) string { return "mesh.seat." + seat + ".accept." + verb }

// SeatNodeAcceptSubject is the work queue of a node-scoped seat's verb on node:
// mesh.seat.<seat>.node.<node>.accept.<verb>.
func SeatNodeAcceptSubject(seat, node, verb string) string {
	return "mesh.seat." + seat + ".node." + node + ".accept." + verb
}

// SeatEventSubject is where a seat's holder emits event: mesh.seat.<seat>.event.<event>.
func SeatEventSubject(seat, event string) string { return "mesh.seat." + seat + ".event." + event }

// SeatToolSubject is where a seat's holder answers verb: mesh.seat.<seat>.tool.<verb>.
func SeatToolSubject(seat, verb string) string { return "mesh.seat." + seat + ".tool." + verb }

// NodeEventSubject is where node emits its own events (joined, left, unreachable):
// mesh.node.<node>.event.<event>.
func NodeEventSubject(node, event string) string { return "mesh.node." + node + ".event." + event }

// NodeToolSubject is a node's own tool: mesh.node.<node>.tool.<tool>, core request/reply
// answered by that node (such as a module asking its node to hold its seats).
func NodeToolSubject(node, tool string) string { return "mesh.node." + node + ".tool." + tool }

// NodeSeatToolSubject is where an instance of module asks node to hold, or release, its
// seats: mesh.node.<node>.tool.seat.<module>. The module's name in the subject is the proof
// of who asks.
func NodeSeatToolSubject(node, module string) string { return NodeToolSubject(node, "seat."+module) }

// ConsumerInfoSubject is the JetStream API subject that looks a consumer up.
func ConsumerInfoSubject(stream, consumer string) string {
	return consumerInfoSubject(stream, consumer)
}

// StateSubject is where node's declaration lives, last value per subject:
// mesh.state.node.<node>.
func StateSubject(node string) string { return "mesh.state.node." + node }

// Replays (DESIGN §2, §3): `dead replay` republishes an event for the one consumer that gave up
// on it, on mesh.replay.<consumer>.<original subject>. EVENTS captures them (ReplayEvents),
// and only that consumer's filter matches (ReplayFilter), so no other consumer of the event
// sees it twice. The fourth token is always "mesh", never "event", so neither the stream's
// two subjects nor a consumer's filters overlap (nats-server refuses overlapping ones).
const ReplayEvents = "mesh.replay.*.mesh.>"

// ReplaySubject is where the event first published on original is replayed to consumer.
func ReplaySubject(consumer, original string) string {
	return "mesh.replay." + consumer + "." + original
}

// ReplayFilter is the filter that delivers consumer's replays.
func ReplayFilter(consumer string) string { return "mesh.replay." + consumer + ".mesh.>" }

// ReplayOf returns the consumer and the original subject of a replay's subject; ok is false
// for any other subject.
func ReplayOf(subject string) (consumer, original string, ok bool) {
	rest, ok := strings.CutPrefix(subject, "mesh.replay.")
	if !ok {
		return "", "", false
	}
	consumer, original, ok = strings.Cut(rest, ".")
	if !ok || consumer == "" || !strings.HasPrefix(original, "mesh.") {
		return "", "", false
	}
	return consumer, original, true
}

// Original is the subject an event was first published on: subject itself, or the original
// of a replay.
func Original(subject string) string {
	if _, original, ok := ReplayOf(subject); ok {
		return original
	}
	return subject
}

// DeadSubject is where a consumer's dead letters go: mesh.dead.<stream>.<consumer>.
func DeadSubject(stream, consumer string) string { return "mesh.dead." + stream + "." + consumer }

// InboxPrefix is module's own inbox prefix, _INBOX.<module>: a module subscribes under it
// (nats.CustomInboxPrefix) and nowhere else's replies reach it.
func InboxPrefix(module string) string { return "_INBOX." + module }

// InInbox reports whether reply lies in the inbox space prefix names (prefix ".…"): where a
// requester's identity is known from the subject it could publish on, its answer goes to its
// own inbox and nowhere else.
func InInbox(reply, prefix string) bool {
	return len(reply) > len(prefix)+1 && strings.HasPrefix(reply, prefix+".")
}

// seatAcceptAll and seatNodeAcceptAll are every verb of a seat's work queue, mesh- and
// node-scoped; seatToolAll every call its holder answers.
func seatAcceptAll(seat string) string     { return "mesh.seat." + seat + ".accept.>" }
func seatNodeAcceptAll(seat string) string { return "mesh.seat." + seat + ".node.*.accept.>" }
func seatNodeAccept(seat, node string) string {
	return "mesh.seat." + seat + ".node." + node + ".accept.>"
}
func seatToolAll(seat string) string { return "mesh.seat." + seat + ".tool.>" }

// The JetStream API subjects a client needs to pull and ack one consumer (DESIGN §5,
// checked on nats-server 2.15.2): nats.go's js.Consumer() asks for INFO.
func consumerInfoSubject(stream, consumer string) string {
	return "$JS.API.CONSUMER.INFO." + stream + "." + consumer
}
func consumerNextSubject(stream, consumer string) string {
	return "$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer
}
func consumerAckSubject(stream, consumer string) string {
	return "$JS.ACK." + stream + "." + consumer + ".>"
}

// Matches reports whether the NATS subject pattern (with * and >) matches the literal
// subject.
func Matches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

// SplitSubject splits a subject of the grammar, mesh.<namespace>.<owner>.<rest>, into its
// namespace (mod, seat, node, …), the owner (a module, seat or node) and the rest; ok is
// false for a subject of fewer than four tokens.
func SplitSubject(subject string) (namespace, owner, rest string, ok bool) {
	parts := strings.SplitN(subject, ".", 4)
	if len(parts) < 4 {
		return "", "", "", false
	}
	return parts[1], parts[2], parts[3], true
}
