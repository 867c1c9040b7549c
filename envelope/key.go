package envelope

import "strings"

// Key names an event the way a manifest's consumes does, from its subject:
// mesh.mod.billing.event.order.placed → billing.order.placed, a seat's event
// mesh.seat.mailer.event.delivered → seat.mailer.delivered (the seat, never whoever holds
// it), and a node's mesh.node.alpha.event.joined → alpha.joined. A subject outside the event
// grammar is returned unchanged.
func Key(subject string) string {
	parts := strings.SplitN(subject, ".", 5)
	if len(parts) < 5 || parts[0] != "mesh" || parts[3] != "event" {
		return subject
	}
	if parts[1] == "seat" {
		return "seat." + parts[2] + "." + parts[4]
	}
	return parts[2] + "." + parts[4]
}
