// Package audit is the per-node audit logger (DESIGN §10): a durable consumer of every event
// in the mesh (audit-<node> on EVENTS), written to the node's bbolt file before it is acked,
// deduplicated by x-event-id, each record hash-chained to the one before, with its
// signature and its source checked and the outcome recorded — a forged event is kept and
// flagged, never dropped. Records are indexed by event id, source, subject and time.
package audit
