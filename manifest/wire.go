package manifest

import (
	"regexp"
	"slices"
	"strings"
)

// fieldKind says what a manifest value names, which decides its grammar and what to write
// instead when it is refused.
type fieldKind int

const (
	kindModule   fieldKind = iota // module:
	kindSeat                      // a key of seats:
	kindRequire                   // requires:
	kindSecret                    // secrets:
	kindBuildOn                   // build.on:
	kindEmit                      // emits:
	kindSeatEmit                  // seats.S.emits:
	kindConsume                   // consumes:
	kindTool                      // tools:
	kindAccept                    // seats.S.accepts:
	kindServe                     // seats.S.serves:
	kindUses                      // uses:
	kindProvide                   // seats.S.provides:
)

// dotted reports whether names of this kind may have several dot-separated parts.
func (k fieldKind) dotted() bool {
	return k == kindEmit || k == kindSeatEmit || k == kindSecret || k == kindConsume
}

// noun names one value of the kind, for messages.
func (k fieldKind) noun() string {
	switch k {
	case kindModule:
		return "a module name"
	case kindSeat:
		return "a seat name"
	case kindRequire:
		return "a requirement"
	case kindSecret:
		return "a secret name"
	case kindBuildOn:
		return "a module name"
	case kindEmit, kindSeatEmit:
		return "an event name"
	case kindConsume:
		return "an <emitter>.<event> pattern"
	case kindTool, kindServe:
		return "a tool name"
	case kindAccept:
		return "a verb"
	case kindUses:
		return "a seat name"
	case kindProvide:
		return "an interface name"
	}
	return "a name"
}

// wireKindRE finds the subject grammar's kind token inside a value, between dots, with an
// optional version token before it: mesh.seat.<seat>.v2.<kind>.<verb> is reserved for
// versioned seat protocols, so its shape is refused today as well.
var wireKindRE = regexp.MustCompile(`\.(?:v[0-9]+\.)?(?:event|tool|accept)\.`)

var versionRE = regexp.MustCompile(`^v[0-9]+$`)

// wire is a value read in a wire's grammar: a NATS subject of DESIGN §2, or a routing key of
// the old AMQP bus (module.<module>.<event>).
type wire struct {
	ns    string   // mod, seat, node, * or "" when the value does not say
	owner string   // the module, seat or node the subject belongs to; "" when unknown
	kind  string   // event, tool, accept, or "" when the value does not say
	rest  []string // the local name after the kind token, wildcards in manifest terms
	own   bool     // state or dead letters: the mesh's own subjects
}

// wireSpelling reports whether v is written in a wire's grammar rather than the manifest's
// (refusal rule 1): a NATS subject (mesh.…, or the kind token event/tool/accept in subject
// position), a routing key of the old AMQP bus (origins module., mesh., node.), a wire
// wildcard (AMQP's #, NATS's >), a JetStream API or inbox subject. If so it returns why, and
// what a field of kind k spells instead.
func wireSpelling(v string, k fieldKind) (reason, instead string, ok bool) {
	switch {
	case strings.HasPrefix(v, "$"):
		return "is a NATS system or JetStream API subject; the mesh derives the API subjects a module needs", "remove it", true
	case strings.HasPrefix(v, "_INBOX"):
		return "is an inbox subject; every module's inbox (_INBOX.<module>) is derived", "remove it", true
	}
	if !strings.HasPrefix(v, "mesh.") && !strings.HasPrefix(v, "module.") && !strings.HasPrefix(v, "node.") &&
		!strings.ContainsAny(v, "#>") && !wireKindRE.MatchString(v) {
		return "", "", false // the common case, without splitting
	}
	toks := strings.Split(v, ".")
	wild := ""
	for i, t := range toks {
		if t == "#" || t == ">" {
			if wild == "" {
				wild = t
			}
			toks[i] = "**"
		}
	}
	var w wire
	switch {
	case toks[0] == "mesh" && len(toks) > 1:
		reason = "is a subject; a manifest names things locally and the mesh derives every subject"
		w = readSubject(toks[1:])
	case (toks[0] == "module" || toks[0] == "node") && len(toks) > 1:
		reason = "is a routing key of the old AMQP bus; a manifest names things locally"
		w = wire{ns: "mod", owner: toks[1], kind: "event", rest: toks[2:]}
		if toks[0] == "node" {
			w.ns = "node"
		}
		if w.owner == "**" { // module.# is every module's events
			w.owner, w.rest = "*", []string{"**"}
		}
	case wireKindRE.MatchString(v):
		reason = "holds the subject grammar's kind token; a manifest names things locally and the mesh adds it"
		w = readSubject(toks)
	case wild == "#":
		reason = "uses AMQP's wildcard #; the manifest's is **"
		w = wire{rest: toks}
	case wild == ">":
		reason = "uses NATS's wildcard >; the manifest's is **"
		w = wire{rest: toks}
	default:
		return "", "", false
	}
	return reason, w.instead(k), true
}

// readSubject reads the tokens of a subject after "mesh.": <ns>.<owner>[.node.<node>][.vN].<kind>.<rest>,
// and the forms that leave parts out.
func readSubject(toks []string) wire {
	var w wire
	if toks[0] == "state" || toks[0] == "dead" {
		return wire{own: true}
	}
	i := 0
	switch {
	case len(toks) == 2 && slices.Contains([]string{"mod", "seat", "node", "*"}, toks[0]) && toks[1] == "**":
		return wire{ns: toks[0], owner: "*", rest: []string{"**"}} // mesh.mod.>: every owner's
	case len(toks) > 2 && slices.Contains([]string{"mod", "seat", "node", "*"}, toks[0]):
		w.ns, w.owner, i = toks[0], toks[1], 2
	case len(toks) > 1:
		w.owner, i = toks[0], 1
	}
	if w.ns == "seat" && i+2 < len(toks) && toks[i] == "node" {
		i += 2 // node-scoped: mesh.seat.<seat>.node.<node>.accept.<verb>
	}
	if i < len(toks) && versionRE.MatchString(toks[i]) {
		i++
	}
	if i < len(toks) && isKindToken(toks[i]) {
		w.kind, w.rest = toks[i], toks[i+1:]
		return w
	}
	if w.ns != "" && !slices.ContainsFunc(toks[i:], isKindToken) {
		// mesh.mod.<module>.>: every subject of one owner, whatever its kind.
		w.rest = toks[i:]
		return w
	}
	if w.ns == "" && w.owner != "" && !slices.ContainsFunc(toks, isKindToken) {
		// mesh.<emitter>.<event>: the old bus's routing key with origin mesh.
		w.kind, w.rest = "event", toks[1:]
		return w
	}
	// The kind token is somewhere unexpected: drop it (and a version before it).
	w = wire{}
	for j, t := range toks {
		if isKindToken(t) || (versionRE.MatchString(t) && j+1 < len(toks) && isKindToken(toks[j+1])) {
			continue
		}
		w.rest = append(w.rest, t)
	}
	return w
}

func isKindToken(t string) bool { return t == "event" || t == "tool" || t == "accept" }

// instead says what a field of kind k spells instead of w.
func (w wire) instead(k fieldKind) string {
	if w.own {
		return "remove it: node state and dead letters are the mesh's own"
	}
	rest := strings.Join(w.rest, ".")
	switch k {
	case kindConsume:
		switch {
		case w.ns == "*" && w.owner == "*" && rest == "**":
			return "write **"
		case w.kind == "accept":
			return "to send work to seat " + w.owner + ", write uses: [" + w.owner + "]"
		case w.kind == "tool":
			return "remove it: a tool is called, not consumed"
		case w.ns == "seat" && w.owner != "" && rest != "":
			return "write seat." + w.owner + "." + rest // a seat's events, by its name
		case w.ns == "seat":
			return "write seat.<seat>.<event>, e.g. seat.mailer.delivered"
		case w.ns == "node":
			return "remove it: node events are the mesh's own (** alone includes them)"
		case w.owner != "" && rest != "":
			return "write " + w.owner + "." + rest
		case w.owner != "":
			return "write " + w.owner + ".**"
		case rest != "":
			return "write " + rest
		}
		return "write <emitter>.<event>, e.g. billing.order.placed"
	case kindEmit, kindSeatEmit:
		switch {
		case w.kind == "tool" && k == kindEmit:
			return "declare it under tools: write " + rest
		case w.kind == "tool":
			return "declare it under serves: write " + rest
		case w.kind == "accept" && k == kindSeatEmit:
			return "declare it under accepts: write " + rest
		case rest == "" || strings.Contains(rest, "*"):
			return "write one event's name, e.g. order.placed; wildcards belong in consumes"
		}
		return "write " + rest
	case kindTool, kindServe, kindAccept:
		if rest == "" || strings.Contains(rest, "*") {
			return "write one name, e.g. status"
		}
		return "write " + rest
	case kindUses:
		if w.ns == "seat" && w.owner != "" {
			return "write " + w.owner
		}
		return "write the seat's name, e.g. mailer"
	}
	return "write a plain name: lower-case letters, digits and '-'"
}
