package api

import (
	"time"

	"github.com/meshnode/meshnode/manifest"
)

// The audit log is read through its node's tool, mesh.node.<node>.tool.audit: audit.Call
// asks it.

// AuditToolSubject is node's audit tool.
func AuditToolSubject(node string) string { return manifest.NodeToolSubject(node, "audit") }

// AuditRequest asks a node's audit log: Op "query" (with Filter) or "verify".
type AuditRequest struct {
	Op     string      `json:"op"`
	Filter AuditFilter `json:"filter"`
	// Progress asks a verify to answer with how far it has got, about once a second, before
	// its verification (see audit.CallProgress).
	Progress bool `json:"progress,omitempty"`
}

// AuditReply answers AuditRequest.
type AuditReply struct {
	Records      []AuditRecord      `json:"records,omitempty"`
	Verification *AuditVerification `json:"verification,omitempty"`
	Progress     *AuditProgress     `json:"progress,omitempty"` // an interim answer: more follows
	Error        string             `json:"error,omitempty"`
}

// AuditDefaultLimit bounds a query's answer when it sets no limit.
const AuditDefaultLimit = 200

// AuditFilter selects records. Every field set must hold.
type AuditFilter struct {
	ID     string    `json:"id,omitempty"`     // x-event-id
	Source string    `json:"source,omitempty"` // x-source
	Event  string    `json:"event,omitempty"`  // a pattern as consumes: writes it: billing.**
	Since  time.Time `json:"since,omitzero"`   // received at or after
	Until  time.Time `json:"until,omitzero"`   // received before
	After  uint64    `json:"after,omitempty"`  // records after this N (paging, tail -f)
	Before uint64    `json:"before,omitempty"` // records before this N (paging back, with Last)
	Last   int       `json:"last,omitempty"`   // only the last N matching records
	Limit  int       `json:"limit,omitempty"`  // at most this many; 0 = AuditDefaultLimit
}

// AuditProblem is a record that fails verification.
type AuditProblem struct {
	N      uint64 `json:"n"`
	Reason string `json:"reason"`
}

// AuditVerification is what a verify of the log found.
type AuditVerification struct {
	Records uint64 `json:"records"`
	// Broken is the first record whose hash or link does not hold: the log was altered or
	// truncated. It is about the log, not about the events in it.
	Broken *AuditProblem `json:"broken,omitempty"`
	// Flagged are the records whose event is not genuine (forged, mislabelled, unsigned),
	// oldest first, at most audit.MaxFlagged of them; FlaggedTotal counts all. The log holding them
	// is intact: they were recorded as they arrived, and flagged.
	Flagged      []AuditFlag `json:"flagged,omitempty"`
	FlaggedTotal uint64      `json:"flagged_total,omitempty"`
	// Restored is what the log's first record says when the node was restored from a
	// snapshot (genesis --from-snapshot): the log begins there, not with a silent gap.
	Restored *AuditRestored `json:"restored,omitempty"`
}

// AuditRestored is the body of the record a restored node's log begins with (event
// mesh.node.<node>.event.restored, signed by the node): the snapshot it was restored from.
type AuditRestored struct {
	Node   string `json:"node"`
	MeshID string `json:"mesh_id"`
	// Snapshot is the SHA-256 of the snapshot's manifest (hex), which names every stream's
	// checksum; File where it was read; Created when it was saved.
	Snapshot string    `json:"snapshot"`
	File     string    `json:"file"`
	Created  time.Time `json:"created"`
	// Heads are each node's audit-log head when the snapshot was saved, by node: where the
	// logs before the restore ended.
	Heads map[string]AuditHead `json:"heads,omitempty"`
}

// AuditHead is an audit log's last record: its number (0 for an empty log) and chain hash.
type AuditHead struct {
	N    uint64 `json:"n"`
	Hash string `json:"hash"`
}

// AuditFlag is one record whose event is not genuine, and why.
type AuditFlag struct {
	N       uint64 `json:"n"`
	EventID string `json:"event_id"`
	Subject string `json:"subject"`
	Source  string `json:"source"`
	// Kind is one of the AuditFlag* kinds.
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
}

// Why an event is not genuine.
const (
	AuditFlagUnsigned       = "unsigned"        // no x-signature
	AuditFlagUnknownSource  = "unknown-source"  // no registered key for its x-source
	AuditFlagBadSignature   = "bad-signature"   // the signature is not its source's key's over it
	AuditFlagSourceMismatch = "source-mismatch" // its x-source does not own its subject
	AuditFlagReusedID       = "reused-id"       // its x-event-id was first used by another event
	AuditFlagBadID          = "bad-id"          // its x-event-id is not a UUIDv7
)

// OK reports whether the log is intact and every event in it genuine.
func (v AuditVerification) OK() bool { return v.Broken == nil && v.FlaggedTotal == 0 }

// AuditProgress is how far a verify has got: Done of Total records.
type AuditProgress struct {
	Done  uint64 `json:"done"`
	Total uint64 `json:"total"`
}

// AuditRecord is one audited event.
type AuditRecord struct {
	// N is the record's place in this node's log, from 1.
	N uint64 `json:"n"`
	// Seq is the event's sequence in EVENTS.
	Seq      uint64              `json:"seq"`
	Subject  string              `json:"subject"`
	Headers  map[string][]string `json:"headers"`
	Body     []byte              `json:"body"`
	Received time.Time           `json:"received"`
	// EventID is x-event-id (or "seq-<Seq>" for an event without one).
	EventID string `json:"event_id"`
	Source  string `json:"source"`
	// Signed is true when x-signature verifies against the source's registered key;
	// SignatureError says why not otherwise.
	Signed         bool   `json:"signed"`
	SignatureError string `json:"signature_error,omitempty"`
	// SourceMatches is true when x-source owns the subject's namespace.
	SourceMatches bool `json:"source_matches"`
	// ReusedID is the record N of an earlier, different event with the same x-event-id: an
	// emitter reused an id (a true re-publish of the same event is recorded once).
	ReusedID uint64 `json:"reused_id,omitempty"`
	// Prev is the previous record's hash ("" for the first), Hash this record's.
	Prev string `json:"prev"`
	Hash string `json:"hash"`
	// Elided is set only in an answer of the audit tool, never in the log: what of a large
	// record was left out to keep the answer under the bus's message size.
	Elided string `json:"elided,omitempty"`
	// NotGenuine and NotGenuineWhy are set only in an answer, never in the log: the kind
	// (AuditFlag…) and reason `audit verify` gives the record, "" for a genuine event.
	NotGenuine    string `json:"not_genuine,omitempty"`
	NotGenuineWhy string `json:"not_genuine_why,omitempty"`
}
