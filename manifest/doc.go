// Package manifest is the declaration model of the mesh: a module's manifest in; its
// subjects, streams, consumers, permissions and seat fingerprints out (DESIGN §2–§5).
//
// The load-bearing rule: a module names things locally and the mesh derives every subject.
// A manifest never holds a subject, so reorganising the subject space changes this package
// and no manifest in the catalogue. The package is pure: it parses the bytes it is given
// and imports no NATS; later layers turn its Permissions, Stream and Consumer values into
// nats-server's and JetStream's types.
//
// The flow is Parse (strict YAML) → Validate (every per-manifest refusal) → CheckCatalogue
// (refusals against the other registered manifests and the module's previous version) →
// Derive; Check runs the first three in one pass, and keeps going past unknown keys. Every
// refusal is a Refusal naming the field, the value, why, and what to write instead, with a
// line when parsed; they come back all at once as Refusals, so a user fixes a manifest in
// one pass. Derive validates again: a Derivation exists only for a valid manifest.
//
// # Derivation
//
// For module M (subjects.go spells the grammar):
//
//   - emits: e        → publish mesh.mod.M.event.e
//   - consumes: p     → one durable consumer M on EVENTS, filtered on the derived patterns;
//     a pattern covered by another of M's is dropped from the filters (JetStream refuses a
//     filter inside another in one consumer, error 10138; it accepts filters that only
//     partially overlap, such as *.download.completed and builder.**, and delivers each
//     message once)
//   - tools: t        → subscribe mesh.mod.M.tool.t in queue group M, reply to requests
//   - uses: S         → publish mesh.seat.S.accept.>, mesh.seat.S.node.*.accept.> and
//     mesh.seat.S.tool.> (requests); never subscribe on anything of S's
//   - always          → subscribe on the inbox _INBOX.M.>
//   - seat S declared → stream SEAT_S (work queue, max age = retain) and consumer seat-S
//     (node scope: seat-S-<node>, filtered to that node), and holder permissions granted
//     only while an instance holds S's lease: pull/ack that consumer, publish
//     mesh.seat.S.event.*, answer mesh.seat.S.tool.* in queue group S.
//
// The JetStream API is otherwise closed: a module gets INFO, MSG.NEXT and ACK for its own
// consumers and nothing else; a JetStream publish needs no API grant. Nobody but the node
// publishes on mesh.dead.>: the node writes a dead letter from JetStream's advisories, and a
// client gives up on a message by terminating it (+TERM, with its reason) on its ack subject.
//
// # Decisions where the design is silent
//
//   - Missing scope is refused rather than defaulted: it changes every accept subject.
//     Retain is required when a seat accepts work (its backlog needs an age) and optional
//     otherwise; it is written with the units d (24h), h, m, s, e.g. 7d or 1d12h, and must
//     be positive.
//   - A seat that accepts nothing (a pure role, or one that only serves) gets no stream and
//     no consumer.
//   - Module names mesh, module and node are reserved (the old bus's routing keys began with
//     them, so their events could never be named in consumes), and so is the prefix audit-
//     (the per-node audit-<node> consumers share EVENTS with module consumers).
//   - Names are at most MaxNameLen bytes in all, dots included. Event and secret names may be
//     dotted; module, seat, tool, verb, requirement and build.on names are one part.
//   - A value holding the subject grammar's kind token (event, tool, accept) between dots,
//     with or without a version token before it (mesh.seat.S.v2.accept.send is reserved for
//     versioned protocols), is refused as a subject, even when it could have been a name.
//   - A module's EVENTS consumer delivers new events only: a module registered today
//     reacts to what happens from now on rather than replaying a week of history. Seat and
//     audit consumers deliver everything kept: a seat's backlog is the point of its queue.
//   - Back-off is 30s, 1m, 5m, 15m with MaxDeliver 5: JetStream uses the first step as the
//     ack wait, so it is the server's default 30s rather than something shorter.
//   - allow-responses is granted only with something to answer: tools (always) or a held
//     seat's serves (while holding).
//   - A module that does not require mesh-bus has no account: its Permissions are empty.
//   - Consuming one's own events is allowed, but they must be among one's emits.
//   - A module may use a seat it declares itself (an instance that does not hold it sends
//     work to the holder), and may use mesh-* seats.
//   - Catalogue checks run from both sides: a consumer naming a present emitter must match
//     one of its emits, and an emitter may not register (or re-register) without an event a
//     catalogue module consumes by its name. Removing a seat, or changing its scope, while
//     it is used is a breaking change like removing an accept or serve.
//   - The fingerprint covers the scope as well as accepts, serves and emits, because scope
//     decides the accept subjects; retain is not part of the protocol.
//   - A node-scoped seat's serves stay mesh.seat.S.tool.<verb> (DESIGN §2 has no per-node
//     tool subject): every node's holder answers in queue group S, so a call reaches one
//     holder, not a chosen node's.
//   - A seat's events cannot yet be named in consumes (a module and a seat may share a name,
//     so <name>.<event> would be ambiguous); ** alone includes them.
package manifest
