package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// fingerprintVersion names the canonical form Fingerprint hashes; change it with the form.
const fingerprintVersion = "meshnode seat protocol v1"

// Fingerprint returns seat s's protocol fingerprint: the hex SHA-256 of a canonical form of
// its scope and its sorted accepts, serves and emits. It is stable across the order of
// declaration and changes with any change to the protocol, additive ones included, so it
// records which protocol a caller was bound to; whether a change breaks callers is
// CheckCatalogue's question, not the hash's. Scope is part of the protocol because it
// decides the accept subjects: a seat moving from mesh to node scope moves its work queue.
// Retain is not: it is the seat's own business.
func Fingerprint(s Seat) string {
	var b strings.Builder
	b.WriteString(fingerprintVersion)
	b.WriteByte('\n')
	field := func(kind string, names ...string) {
		names = slices.Clone(names)
		slices.Sort(names)
		for _, n := range slices.Compact(names) {
			// Length-prefixed, so no name can forge another entry.
			b.WriteString(kind)
			b.WriteByte(' ')
			b.WriteString(strconv.Itoa(len(n)))
			b.WriteByte(':')
			b.WriteString(n)
			b.WriteByte('\n')
		}
	}
	field("scope", string(s.Scope))
	// Later versions and shapes only when declared, so a seat without any keeps the
	// fingerprint it had before they existed. encoding/json writes map keys sorted: the
	// form is canonical.
	for _, at := range s.each() {
		prefix := ""
		if at.name != V1 {
			field("version", at.name)
			prefix = at.name + " "
		}
		field(prefix+"accept", at.seat.Accepts...)
		field(prefix+"serve", at.seat.Serves...)
		field(prefix+"emit", at.seat.Emits...)
		for _, name := range sortedKeys(at.seat.Shapes) {
			if js, err := json.Marshal(at.seat.Shapes[name]); err == nil {
				field(prefix+"shape", name+" "+string(js))
			}
		}
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:])
}
