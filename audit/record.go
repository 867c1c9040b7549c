package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/meshnode/meshnode/api"
)

// computeHash is the hash of a record stored as JSON (logs written before the compact
// encoding, encoding.go): SHA-256 over the record's JSON without its own hash. It covers the
// previous hash, so a change anywhere breaks every hash after it.
func computeHash(r api.AuditRecord) string {
	r.Hash = ""
	b, _ := json.Marshal(r)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
