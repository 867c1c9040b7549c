package envelope

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// W3C trace context (https://www.w3.org/TR/trace-context/), version 00:
// "00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>", lower case, and neither id all
// zeros. The envelope carries it so a trace follows an event from its emitter through every
// handler to the events and jobs they emit.

// ValidTraceparent reports whether tp is a version-00 traceparent.
func ValidTraceparent(tp string) bool {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return false
	}
	for _, p := range parts[1:] {
		if !isLowerHex(p) {
			return false
		}
	}
	return strings.Trim(parts[1], "0") != "" && strings.Trim(parts[2], "0") != ""
}

// ChildTraceparent is the traceparent of work done on behalf of parent: the same trace and
// flags, a new span id. It is "" when parent is not a valid traceparent.
func ChildTraceparent(parent string) string {
	if !ValidTraceparent(parent) {
		return ""
	}
	var span [8]byte
	for {
		rand.Read(span[:])
		if span != [8]byte{} {
			break
		}
	}
	return parent[:36] + hex.EncodeToString(span[:]) + parent[52:]
}

func isLowerHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
