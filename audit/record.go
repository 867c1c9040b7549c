package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
)

// Record is one audited event.
type Record struct {
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
}

// computeHash is the hash of a record stored as JSON (logs written before the compact
// encoding, encoding.go): SHA-256 over the record's JSON without its own hash. It covers the
// previous hash, so a change anywhere breaks every hash after it.
func (r Record) computeHash() string {
	r.Hash = ""
	b, _ := json.Marshal(r)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
