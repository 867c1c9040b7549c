package manifest

import (
	"slices"
	"strings"
)

// The subject grammar of DESIGN §2. A manifest never holds one of these: the functions below
// are the only place the grammar is spelled, so reorganising the subject space is a change
// here and nowhere in the catalogue. They format; they do not validate their arguments.

// AllEvents is the pattern of every event in the mesh, of modules, seats and nodes alike —
// but for the events of a seat's later protocol versions (VersionedEvents): the EVENTS
// stream's first subject and what consumes: ["**"] derives. The kind token is what keeps
// tool calls and work out of it.
const AllEvents = "mesh.*.*.event.>"

// VersionedEvents are the patterns of every seat's events in its later protocol versions,
// one per version (mesh.seat.*.v2.event.>, …): a wildcard version token would overlap
// AllEvents, which nats-server refuses within a stream and within a consumer's filters.
func VersionedEvents() []string {
	var out []string
	for _, v := range LaterVersions() {
		out = append(out, "mesh.seat.*."+v+".event.>")
	}
	return out
}

// EventPatterns are every event's patterns: AllEvents and VersionedEvents.
func EventPatterns() []string { return append([]string{AllEvents}, VersionedEvents()...) }

// IsEvent reports whether subject is an event's (of a module, node or seat, of any version).
func IsEvent(subject string) bool {
	return slices.ContainsFunc(EventPatterns(), func(p string) bool { return Matches(p, subject) })
}

// The mesh's own streams.
const (
	// EventsStreamName is the name of the stream every event lands in.
	EventsStreamName = "EVENTS"
	// StateStreamName is the name of the stream of node declarations, last value per node.
	StateStreamName = "STATE"
	// DeadStreamName is the name of the dead-letter stream.
	DeadStreamName = "DEAD"
)

// AdmitPrefix begins every subject a module publishes to JetStream on (DESIGN §14): not the
// stream's subject itself but mesh.admit.<module>.<subject>, which the node's admitter
// (package admit) takes, checks against the module's quota, pace and the audit's lag, and
// publishes on to the stream. Only module may publish under its own prefix, so the subject
// proves who sent it; the fourth token is "mesh", never "event", so no stream captures it.
const AdmitPrefix = "mesh.admit."

// AdmitAll is the pattern of every subject the admitter takes.
const AdmitAll = AdmitPrefix + ">"

// AdmitSubject is where module publishes what should land on subject (an event or a seat's
// job): mesh.admit.<module>.<subject>.
func AdmitSubject(module, subject string) string { return AdmitPrefix + module + "." + subject }

// AdmitOf returns the module and the stream subject of an admit subject; ok is false for
// any other subject.
func AdmitOf(subject string) (module, target string, ok bool) {
	rest, ok := strings.CutPrefix(subject, AdmitPrefix)
	if !ok {
		return "", "", false
	}
	module, target, ok = strings.Cut(rest, ".")
	return module, target, ok && module != "" && strings.HasPrefix(target, "mesh.")
}

// EventSubject is where module emits event: mesh.mod.<module>.event.<event>.
func EventSubject(module, event string) string { return "mesh.mod." + module + ".event." + event }

// ToolSubject is where module answers tool: mesh.mod.<module>.tool.<tool>.
func ToolSubject(module, tool string) string { return "mesh.mod." + module + ".tool." + tool }

// StatsSubject is where a module's instances connected to node report the latency of the
// tools they answer (package toolstats): core NATS, never stored; only that node listens.
func StatsSubject(module, node string) string { return "mesh.mod." + module + ".stats." + node }

// seatBase is the subject prefix of version of seat: mesh.seat.<seat> for v1 (or ""),
// mesh.seat.<seat>.<version> for a later one.
func seatBase(seat, version string) string {
	if version == "" || version == V1 {
		return "mesh.seat." + seat
	}
	return "mesh.seat." + seat + "." + version
}

// SeatAcceptSubject is the work queue of a mesh-scoped seat's verb:
// mesh.seat.<seat>.accept.<verb>.
func SeatAcceptSubject(seat, verb string) string { return SeatAcceptSubjectAt(seat, V1, verb) }

// SeatAcceptSubjectAt is SeatAcceptSubject of a version: mesh.seat.<seat>.<version>.accept.<verb>
// for v2 … v9.
func SeatAcceptSubjectAt(seat, version, verb string) string {
	return seatBase(seat, version) + ".accept." + verb
}

// SeatNodeAcceptSubject is the work queue of a node-scoped seat's verb on node:
// mesh.seat.<seat>.node.<node>.accept.<verb>.
func SeatNodeAcceptSubject(seat, node, verb string) string {
	return SeatNodeAcceptSubjectAt(seat, V1, node, verb)
}

// SeatNodeAcceptSubjectAt is SeatNodeAcceptSubject of a version:
// mesh.seat.<seat>.<version>.node.<node>.accept.<verb> for v2 … v9.
func SeatNodeAcceptSubjectAt(seat, version, node, verb string) string {
	return seatBase(seat, version) + ".node." + node + ".accept." + verb
}

// SeatEventSubject is where a seat's holder emits event: mesh.seat.<seat>.event.<event>.
func SeatEventSubject(seat, event string) string { return SeatEventSubjectAt(seat, V1, event) }

// SeatEventSubjectAt is SeatEventSubject of a version: mesh.seat.<seat>.<version>.event.<event>.
func SeatEventSubjectAt(seat, version, event string) string {
	return seatBase(seat, version) + ".event." + event
}

// SeatToolSubject is where a seat's holder answers verb: mesh.seat.<seat>.tool.<verb>.
func SeatToolSubject(seat, verb string) string { return SeatToolSubjectAt(seat, V1, verb) }

// SeatToolSubjectAt is SeatToolSubject of a version: mesh.seat.<seat>.<version>.tool.<verb>.
func SeatToolSubjectAt(seat, version, verb string) string {
	return seatBase(seat, version) + ".tool." + verb
}

// Unversioned returns a seat's subject in a later protocol version as v1's subject of the
// same kind and name (mesh.seat.mailer.v2.event.sent → mesh.seat.mailer.event.sent), and any
// other subject unchanged: what a consumes pattern, which names no version, is matched with.
func Unversioned(subject string) string {
	ss, ok := ParseSeatSubject(subject)
	if !ok || ss.Version == V1 {
		return subject
	}
	return strings.Replace(subject, "mesh.seat."+ss.Seat+"."+ss.Version+".", "mesh.seat."+ss.Seat+".", 1)
}

// SeatSubject is a seat subject taken apart by ParseSeatSubject.
type SeatSubject struct {
	Seat    string
	Version string // V1 for the unversioned subjects
	Node    string // a node-scoped accept subject's node; "" otherwise
	Kind    string // "accept", "event" or "tool"
	Name    string // the verb, event or tool (dotted for an event)
}

// ParseSeatSubject takes a subject of a seat apart: mesh.seat.<seat>[.<version>][.node.<node>].
// <kind>.<name>. ok is false for any other subject.
func ParseSeatSubject(subject string) (SeatSubject, bool) {
	rest, ok := strings.CutPrefix(subject, "mesh.seat.")
	if !ok {
		return SeatSubject{}, false
	}
	toks := strings.Split(rest, ".")
	out := SeatSubject{Seat: toks[0], Version: V1}
	toks = toks[1:]
	if len(toks) > 0 && validVersion(toks[0]) {
		out.Version, toks = toks[0], toks[1:]
	}
	if len(toks) > 2 && toks[0] == "node" {
		out.Node, toks = toks[1], toks[2:]
	}
	if len(toks) < 2 || out.Seat == "" {
		return SeatSubject{}, false
	}
	switch out.Kind = toks[0]; out.Kind {
	case "accept", "tool":
		if len(toks) != 2 || (out.Node != "" && out.Kind != "accept") {
			return SeatSubject{}, false
		}
	case "event":
		if out.Node != "" {
			return SeatSubject{}, false
		}
	default:
		return SeatSubject{}, false
	}
	out.Name = strings.Join(toks[1:], ".")
	return out, true
}

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

// seatAcceptAll and seatNodeAcceptAll are every verb of a version of a seat's work queue,
// mesh- and node-scoped; seatToolAll every call its holder answers in that version.
func seatAcceptAll(seat, version string) string { return seatBase(seat, version) + ".accept.>" }
func seatNodeAcceptAll(seat, version string) string {
	return seatBase(seat, version) + ".node.*.accept.>"
}
func seatNodeAccept(seat, version, node string) string {
	return seatBase(seat, version) + ".node." + node + ".accept.>"
}
func seatToolAll(seat, version string) string { return seatBase(seat, version) + ".tool.>" }

// SeatJobPatterns are every seat's work queues, mesh- and node-scoped, of v1 and of a later
// version: what passes a seat's job on (the admitter, a node, a site's link).
func SeatJobPatterns() []string {
	return []string{seatAcceptAll("*", V1), seatNodeAcceptAll("*", V1), seatAcceptAll("*", "*"), seatNodeAcceptAll("*", "*")}
}

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
