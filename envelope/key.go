package envelope

import "strings"

// Key names an event the way a manifest's consumes does, from its subject:
// mesh.mod.billing.event.order.placed → billing.order.placed, a seat's event
// mesh.seat.mailer.event.delivered → seat.mailer.delivered (the seat, never whoever holds
// it, in any version of its protocol: mesh.seat.mailer.v2.event.delivered too), and a
// node's mesh.node.alpha.event.joined → node.alpha.joined (manifest.EventPattern reads every
// one of these back). A subject outside the event grammar is returned unchanged.
func Key(subject string) string {
	subject = Unversioned(subject) // the key names no version
	parts := strings.SplitN(subject, ".", 5)
	if len(parts) < 5 || parts[0] != "mesh" || parts[3] != "event" {
		return subject
	}
	switch parts[1] {
	case "seat":
		return "seat." + parts[2] + "." + parts[4]
	case "node":
		return "node." + parts[2] + "." + parts[4] // apart from a module's: a node may share a module's name
	}
	return parts[2] + "." + parts[4]
}

// Unversioned is subject with a seat event's protocol version taken out
// (mesh.seat.mailer.v2.event.delivered → mesh.seat.mailer.event.delivered): the subject its
// Key names, which a pattern of that Key matches.
func Unversioned(subject string) string {
	if v, ok := seatVersion(subject); ok {
		return strings.Replace(subject, "."+v+".event.", ".event.", 1)
	}
	return subject
}

// seatVersion returns the version token of a seat's event in a later protocol version,
// mesh.seat.<seat>.<v2…v9>.event.<event> (manifest.SeatEventSubjectAt).
func seatVersion(subject string) (string, bool) {
	parts := strings.SplitN(subject, ".", 6)
	if len(parts) < 6 || parts[0] != "mesh" || parts[1] != "seat" || parts[4] != "event" {
		return "", false
	}
	v := parts[3]
	if len(v) != 2 || v[0] != 'v' || v[1] < '2' || v[1] > '9' {
		return "", false
	}
	return v, true
}
