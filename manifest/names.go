package manifest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxNameLen is the longest name a manifest may hold, in bytes, dots included.
const MaxNameLen = 64

// ValidName reports whether s is a single name part: lower-case [a-z0-9][a-z0-9-]*, at most
// MaxNameLen bytes. Module, seat, node, tool and verb names are single parts.
func ValidName(s string) bool {
	return len(s) <= MaxNameLen && validPart(s)
}

// validDotted reports whether s is one or more name parts joined by dots (event and secret
// names), at most MaxNameLen bytes in all.
func validDotted(s string) bool {
	if len(s) > MaxNameLen {
		return false
	}
	for part := range strings.SplitSeq(s, ".") {
		if !validPart(part) {
			return false
		}
	}
	return true
}

func validPart(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case c == '-' && i > 0:
		default:
			return false
		}
	}
	return true
}

// nameProblem says what is wrong with s as a name (dotted if hierarchical), and a corrected
// spelling when one is obvious.
func nameProblem(s string, dotted bool) (reason, fixed string) {
	if len(s) > MaxNameLen {
		return fmt.Sprintf("is %d characters; a name is at most %d", len(s), MaxNameLen), ""
	}
	fixed = strings.ToLower(s)
	fixed = strings.Map(func(r rune) rune {
		switch r {
		case '_', ' ', '/', ':':
			return '-'
		}
		return r
	}, fixed)
	if !dotted {
		fixed = strings.ReplaceAll(fixed, ".", "-")
	}
	fixed = strings.Trim(fixed, "-")
	if (dotted && !validDotted(fixed)) || (!dotted && !ValidName(fixed)) {
		fixed = ""
	}
	if !dotted && strings.Contains(s, ".") {
		return "holds a dot; this name is one part", fixed
	}
	for part := range strings.SplitSeq(s, ".") {
		if part == "" {
			return "has an empty part between dots", fixed
		}
		if !validPart(part) {
			return fmt.Sprintf("part %q is not lower-case [a-z0-9][a-z0-9-]*", part), fixed
		}
	}
	return "is not a valid name", fixed
}

// maxRetainDays bounds a seat's retain: 100 years, as config.MaxDuration bounds the node's
// durations. Longer is a typo, and past about 106751 days a time.Duration overflows.
const maxRetainDays = 36500

// MinRetain is the shortest retain: a seat's stream keeps its backlog for MaxAge = retain,
// and JetStream refuses a MaxAge under 100ms (nats-server's checkStreamCfg, "max age needs
// to be >= 100ms"); check refuses it here rather than register failing with JetStream's error.
const MinRetain = 100 * time.Millisecond

// ParseRetain parses a seat's retain: a duration written with the units d (24h), h, m and
// s, e.g. 7d, 36h, 1d12h, 90m, at least MinRetain and at most 36500d in all. Zero,
// negative and unit-less values are refused.
func ParseRetain(s string) (time.Duration, error) {
	const maxRetain = maxRetainDays * 24 * time.Hour
	tooLong := fmt.Errorf("retain %q: longer than %d days", s, maxRetainDays)
	rest := s
	var d time.Duration
	if i := strings.IndexByte(rest, 'd'); i >= 0 {
		days, err := strconv.ParseUint(rest[:i], 10, 32)
		if errors.Is(err, strconv.ErrRange) {
			return 0, tooLong
		}
		if err != nil || i == 0 {
			return 0, fmt.Errorf("retain %q: days must be a whole number, as in 7d", s)
		}
		if days > maxRetainDays {
			return 0, tooLong
		}
		d = time.Duration(days) * 24 * time.Hour
		rest = rest[i+1:]
	}
	if rest != "" {
		if rest[0] == '-' || rest[0] == '+' {
			return 0, fmt.Errorf("retain %q: must be positive", s)
		}
		more, err := time.ParseDuration(rest)
		if err != nil {
			return 0, fmt.Errorf("retain %q: not a duration (write e.g. 7d, 36h or 1d12h), or longer than %d days", s, maxRetainDays)
		}
		if more > maxRetain-d {
			return 0, tooLong
		}
		d += more
	}
	if d <= 0 {
		return 0, fmt.Errorf("retain %q: must be positive", s)
	}
	if d < MinRetain {
		return 0, fmt.Errorf("retain %q: shorter than %v, the least a JetStream stream keeps its messages", s, MinRetain)
	}
	return d, nil
}

// The bounds of a seat's backlog. The least is a job of the bus's largest size (nats-server's
// default max_payload, 1 MiB): a queue that cannot hold one job takes none. The most is a
// bound on typos; what a node's store can give is checked at registration.
const (
	MinBacklog = 1 << 20
	MaxBacklog = 1 << 40
)

// ParseBacklog parses a seat's backlog: a whole number of bytes with a unit (KiB, MiB, GiB,
// TiB, KB, MB, GB, TB), from MinBacklog (1MiB) to MaxBacklog (1TiB).
func ParseBacklog(s string) (int64, error) {
	n, err := ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("backlog %w", err)
	}
	if n < MinBacklog || n > MaxBacklog {
		return 0, fmt.Errorf("backlog %q: not from %s (one job of the bus's largest) to %s", s, Size(MinBacklog), Size(MaxBacklog))
	}
	return int64(n), nil
}

// errPattern is wrapped by every consumes-pattern error.
var errPattern = errors.New("invalid consumes pattern")

// patternError is a consumes pattern's problem and the spelling to use instead.
type patternError struct {
	reason, instead string
}

func (e *patternError) Error() string { return e.reason + "; " + e.instead }
func (e *patternError) Unwrap() error { return errPattern }

// ConsumeSubject derives the subject pattern of a consumes entry: billing.order.placed →
// mesh.mod.billing.event.order.placed, *.download.completed →
// mesh.mod.*.event.download.completed, billing.** → mesh.mod.billing.event.>, and ** alone →
// mesh.*.*.event.> (every event of every module, seat and node). It is what `meshnode
// listen PATTERN` takes as well.
func ConsumeSubject(pattern string) (string, error) {
	if pattern == "**" {
		return AllEvents, nil
	}
	if reason, instead, ok := wireSpelling(pattern, kindConsume); ok {
		return "", &patternError{reason, instead}
	}
	parts := strings.Split(pattern, ".")
	if len(parts) < 2 {
		switch p := parts[0]; {
		case p == "*":
			return "", &patternError{"names no event", "write ** for every event, or *.<event>"}
		case validPart(p):
			return "", &patternError{"names a module but no event", "write " + p + ".<event>, or " + p + ".** for every event of " + p}
		}
		return "", &patternError{"is not <emitter>.<event>", "write e.g. billing.order.placed"}
	}
	if len(pattern) > MaxNameLen {
		return "", &patternError{fmt.Sprintf("is %d characters; a pattern is at most %d", len(pattern), MaxNameLen), "shorten it, or use * and **"}
	}
	for i, p := range parts {
		switch {
		case p == "**" && i == len(parts)-1:
			parts[i] = ">"
		case p == "**":
			fix := strings.Join(parts[:i+1], ".")
			if i == 0 { // **.download.completed: an emitter is one name
				fix = strings.Join(replaceAt(parts, 0, "*"), ".")
			}
			return "", &patternError{"holds ** before the last part; ** stands for the rest", "write " + fix}
		case p == "*":
		case strings.Contains(p, "*"):
			return "", &patternError{fmt.Sprintf("part %q mixes * with a name; a wildcard is a whole part", p), "write " + strings.Join(replaceAt(parts, i, "*"), ".")}
		case !validPart(p):
			reason, fixed := nameProblem(pattern, true)
			instead := "use lower-case letters, digits and '-' in each part"
			if fixed != "" {
				instead = "write " + fixed
			}
			return "", &patternError{reason, instead}
		}
	}
	if parts[0] == SeatEventsPrefix {
		return seatConsumeSubject(parts)
	}
	return "mesh.mod." + parts[0] + ".event." + strings.Join(parts[1:], "."), nil
}

// NodeEventsPrefix begins an event pattern naming a node's events, node.<node>.<event>: the
// name `meshnode audit` and `listen` print for mesh.node.<node>.event.<event> ("node" is a
// reserved module name). A module never consumes them; an operator reads them.
const NodeEventsPrefix = "node"

// EventPattern derives the subject pattern of an event pattern as the operator's verbs
// take it (`audit query --event`, `audit tail --event`, `listen`): what ConsumeSubject
// takes, and node.<node>.<event> for the nodes' events — every name the verbs print
// (envelope.Key) is found by itself.
func EventPattern(pattern string) (string, error) {
	parts := strings.Split(pattern, ".")
	if parts[0] != NodeEventsPrefix || len(parts) < 2 {
		return ConsumeSubject(pattern)
	}
	// node.<node>.<event…>, with * and ** as in ConsumeSubject: checked by it as a
	// module's pattern (its first part a name), then placed under mesh.node.
	if parts[1] == "**" && len(parts) == 2 {
		return "mesh.node.*.event.>", nil
	}
	sub, err := ConsumeSubject(strings.Join(parts[1:], "."))
	if err != nil || !strings.HasPrefix(sub, "mesh.mod.") {
		return "", &patternError{"is not node.<node>.<event>", "write e.g. node.alpha.joined, node.*.member-unreachable or node.alpha.**"}
	}
	return "mesh.node." + strings.TrimPrefix(sub, "mesh.mod."), nil
}

// SeatEventsPrefix begins a consumes pattern naming a seat's events: seat.<seat>.<event>.
// "seat" is a reserved module name, so the pattern can mean nothing else.
const SeatEventsPrefix = "seat"

// seatConsumeSubject derives a seat's events pattern, whose parts passed ConsumeSubject's
// checks (with ** already >): seat.mailer.delivered → mesh.seat.mailer.event.delivered,
// seat.*.delivered, seat.mailer.** → mesh.seat.mailer.event.>, seat.** → every seat's events.
func seatConsumeSubject(parts []string) (string, error) {
	switch {
	case len(parts) == 2 && parts[1] == ">":
		return "mesh.seat.*.event.>", nil
	case len(parts) == 2:
		return "", &patternError{"names a seat but no event", "write seat." + parts[1] + ".<event>, or seat." + parts[1] + ".** for every event of the seat"}
	}
	return "mesh.seat." + parts[1] + ".event." + strings.Join(parts[2:], "."), nil
}

func replaceAt(parts []string, i int, v string) []string {
	out := append([]string(nil), parts...)
	out[i] = v
	return out
}

// Subject patterns are compared token by token, with NATS's wildcards: * is one token, > one
// or more at the end.

// covers reports whether every subject matched by b is matched by a.
func covers(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i, x := range at {
		if x == ">" {
			return len(bt) > i
		}
		if i >= len(bt) {
			return false
		}
		y := bt[i]
		switch {
		case y == ">":
			return false
		case x == "*":
		case x != y:
			return false
		}
	}
	return len(at) == len(bt)
}
