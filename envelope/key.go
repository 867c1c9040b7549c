package envelope

import "strings"

// Key names an event the way a manifest does, "<emitter>.<event>", from its subject:
// mesh.mod.billing.event.order.placed → billing.order.placed, and likewise for a seat's or a
// node's events. A subject outside the event grammar is returned unchanged.
func Key(subject string) string {
	parts := strings.SplitN(subject, ".", 5)
	if len(parts) < 5 || parts[0] != "mesh" || parts[3] != "event" {
		return subject
	}
	return parts[2] + "." + parts[4]
}
