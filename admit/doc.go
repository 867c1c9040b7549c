// Package admit is the node's admitter (DESIGN §14): what a module publishes to a stream — its
// events, its seats' events, jobs for the seats it uses — it publishes under its own prefix,
// mesh.admit.<module>.<subject>, and the admitter on its node decides before anything is
// stored. It refuses, with JetStream's error shape so any client sees why: a module's event
// that would take it past its quota of EVENTS (module-events-max-bytes: final); any publish
// past the module's pace (module-emit-rate: retryable); an event while a live member's audit
// log is behind by more than audit-max-lag (retryable: back-pressure, never loss). Otherwise
// it publishes the message unchanged on its subject with the module's reply subject, so the
// stream's PubAck goes straight back to the module. It speaks the client protocol itself
// (wire.go), so the header block passes through as bytes: nats.go would decode and encode it.
//
// nats-server cannot bound one module's share of a shared stream: MaxBytes and MaxMsgSize are
// per stream, MaxMsgsPer one count for every subject, and account limits per account while
// every module is in one. docs/contracts.md says why this hop was chosen over per-module
// accounts, and docs/performance.md what it costs.
//
// A module's use is what this node's audit log holds of its events (audit.Logger.Held) plus
// what this node admitted that the log has not recorded yet (pending); so on one node a burst
// of any size and pace ends at the quota. Instances on several nodes each see the others'
// events once their own audit log has them: the mesh-wide overshoot is at most what the other
// nodes admitted within their audit's lag, which audit-max-lag bounds.
package admit
