package embedbus

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/throttle"
)

// logger routes nats-server's printf-style log into slog. Fatalf does not exit: the first
// fatal message is kept so Open can return it as an error.
type logger struct {
	log *slog.Logger

	mu    sync.Mutex
	fatal string

	damp    damper // the classes of message a flood repeats, a line a second each
	repeats damper // a peer's or client host's repeated errors, a line a minute each (repeatKey)

	// onDenied, when set, is told of a client connection whose publishes the permissions
	// deny keep on (Config.OnDenied); denied counts them per connection.
	onDenied func(cid uint64, denied int)
	denied   deniedCounts

	// keyOf is the key a client connection authenticated with, by its id; moduleOf the
	// module a key is (Config.ModuleOf). They name the client of a violation's line; nil:
	// the line is logged as nats-server wrote it.
	keyOf    func(cid uint64) (string, bool)
	moduleOf func(key string) (string, bool)
}

func (l *logger) Noticef(format string, v ...any) {
	msg := redact(format, v)
	if banner(msg) {
		l.log.Debug(msg)
		return
	}
	l.log.Info(msg)
}

// bannerStarts begin the lines nats-server prints at each start (its version, limits, store
// and listeners): the node's own "node running" line says what an operator needs, so they
// are logged at debug level, not as 24 lines of every start.
var bannerStarts = []string{"Starting nats-server", "Starting JetStream", "Creating JetStream metadata controller",
	"JetStream cluster bootstrapping", "https://docs.nats.io", "Took ", "Listening for ", "Server is ready",
	"Cluster name is", "---", "    _ ", " _ |", "| |", " \\__"}

// banner reports whether msg is one of the lines nats-server prints at start.
func banner(msg string) bool {
	if msg == "" || strings.HasPrefix(msg, "  ") {
		return true // the banner's indented details and blank lines
	}
	for _, p := range bannerStarts {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
func (l *logger) Warnf(format string, v ...any) { l.repeated(slog.LevelWarn, format, v) }

func (l *logger) Errorf(format string, v ...any) {
	// A client's line carries its connection's name and id in the format itself (nats-server
	// prefixes it there), so a denied publish's class is known before anything is formatted:
	// a line the damper drops costs a lookup, not a Sprintf and a regexp. Some classes come
	// in the arguments (an authentication error with its user), so the formatted line is
	// classified when the format is not.
	var msg string
	class := floodClass(format)
	if class == "" {
		msg = redact(format, v)
		class = floodClass(msg)
	}
	if class != "" {
		now := time.Now()
		if class == publishViolation && l.onDenied != nil {
			if cid, ok := clientID(format); ok {
				if flooded, n := l.denied.count(cid, now); flooded {
					l.onDenied(cid, n)
				}
			}
		}
		n, ok := l.damp.admit(class, now, time.Second)
		if !ok {
			return
		}
		if msg == "" {
			msg = redact(format, v)
		}
		// A violation is the client's mistake, not the node's: a warning, naming who.
		level, attrs := slog.LevelError, []any(nil)
		if class == publishViolation || class == subscribeViolation {
			level, attrs = slog.LevelWarn, l.client(format)
		}
		if n > 0 {
			attrs = append(attrs, "suppressed", n, "suppressed_what", "lines like this one in the last second")
		}
		l.log.Log(context.Background(), level, msg, attrs...)
		return
	}
	l.repeated(slog.LevelError, format, v)
}

// client names the client connection of a client's line (format): its key and, for a
// module's, the module — what nats-server's line does not say, and an operator needs to
// find the module at fault.
func (l *logger) client(format string) []any {
	if l.keyOf == nil {
		return nil
	}
	cid, ok := clientID(format)
	if !ok {
		return nil
	}
	key, ok := l.keyOf(cid)
	if !ok {
		return nil // closed since
	}
	if l.moduleOf != nil {
		if module, ok := l.moduleOf(key); ok {
			return []any{"module", module, "key", key}
		}
	}
	return []any{"key", key}
}

// repeated logs a line at level, and of the lines repeatKey groups, the first and then at
// most one a minute per group, counting those left out (which go to debug level): a dead
// peer's route is retried every second on each of its pooled connections, for as long as
// it is gone.
func (l *logger) repeated(level slog.Level, format string, v []any) {
	key, ok := repeatKey(format, v)
	if !ok {
		l.log.Log(context.Background(), level, redact(format, v))
		return
	}
	n, ok := l.repeats.admit(key, time.Now(), time.Minute)
	if !ok {
		l.debug(format, v...)
		return
	}
	if n > 0 {
		l.log.Log(context.Background(), level, redact(format, v), "suppressed", n, "suppressed_what", "lines like this one since it was last logged, a minute or more ago")
		return
	}
	l.log.Log(context.Background(), level, redact(format, v))
}

// routeConnectError is nats-server's format of a failed route dial (connErrFmt in
// server/route.go): its arguments are the attempt and the dial's error, which names the
// peer's address.
const routeConnectError = "Error trying to connect to route (attempt %v): %v"

// connLine matches the prefix nats-server gives a connection's lines ("HOST:PORT - rid:7 - "
// for a route, cid for a client, gid, lid, wid, mid, lid_ws, mid_ws), capturing the
// address and the kind of connection.
var connLine = regexp.MustCompile(`^(\S+) - ([a-z]+(?:_ws)?):\d+ - `)

// repeatKey is the group of a line whose repeats are summarised: a route dial's failure by
// its error (the peer's address and the cause), and a connection's line by the kind of
// connection, its remote host (the port differs at every reconnect) and what it says.
func repeatKey(format string, v []any) (string, bool) {
	if format == routeConnectError && len(v) == 2 {
		return "route dial: " + fmt.Sprint(v[1]), true
	}
	m := connLine.FindStringSubmatch(format)
	if m == nil {
		return "", false
	}
	host, _, err := net.SplitHostPort(m[1])
	if err != nil {
		host = m[1]
	}
	rest := format[len(m[0]):]
	// A client's connection name and account/user follow, quoted by nats-server (%q).
	for strings.HasPrefix(rest, `"`) {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			break
		}
		rest = strings.TrimPrefix(rest[len(q):], " - ")
	}
	return m[2] + " " + host + ": " + rest, true
}

// publishViolation and subscribeViolation are the classes of a publish and a subscription
// the permissions deny.
const (
	publishViolation   = " - Publish Violation - "
	subscribeViolation = " - Subscription Violation - "
)

// floodClasses are the messages nats-server logs once per offending message or connect:
// a publish the permissions deny, a refused connect. A module flooding either would flood
// the node's log, so each class is logged at most once a second, with a count.
var floodClasses = []string{publishViolation, subscribeViolation, " - authentication error"}

// clientID is the connection id in a client's log line ("127.0.0.1:5000 - cid:7 - ...").
func clientID(line string) (uint64, bool) {
	_, rest, ok := strings.Cut(line, " - cid:")
	if !ok {
		return 0, false
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	cid, err := strconv.ParseUint(rest[:end], 10, 64)
	return cid, err == nil
}

// DeniedFlood is how many denied publishes within throttle.FloodWindow tell that a
// connection keeps on sending what it may not (Config.OnDenied): a module that respects its
// permissions has none, and one with a bug that retries a denied subject a few times a
// second is far below it.
const DeniedFlood = 1000

// deniedCounts counts each connection's denied publishes in flood windows; it forgets a
// connection whose window has ended at the next count after maxDeniedTracked of them.
type deniedCounts struct {
	mu sync.Mutex
	m  map[uint64]*throttle.Window
}

// maxDeniedTracked bounds the connections counted at once.
const maxDeniedTracked = 4096

// count counts a denied publish of cid at now; flooded is true once a window, when it
// passes DeniedFlood.
func (d *deniedCounts) count(cid uint64, now time.Time) (flooded bool, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[uint64]*throttle.Window{}
	}
	w := d.m[cid]
	if w == nil {
		if len(d.m) >= maxDeniedTracked {
			clear(d.m) // a new window for every connection: at worst a flood is told later
		}
		w = &throttle.Window{}
		d.m[cid] = w
	}
	return w.Refused(now, throttle.FloodWindow, DeniedFlood)
}

// floodClass is msg's class of floodClasses, "" for none.
func floodClass(msg string) string {
	for _, c := range floodClasses {
		if strings.Contains(msg, c) {
			return c
		}
	}
	return ""
}

// damper lets one message of a class through a period and counts the others.
type damper struct {
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

// maxDamped bounds the classes a damper tracks at once.
const maxDamped = 1024

// admit reports whether a message of class is logged now, at most one a period, and how
// many of its class were not since the last one that was.
func (d *damper) admit(class string, now time.Time, period time.Duration) (suppressed int, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last == nil || (len(d.last) >= maxDamped && d.last[class].IsZero()) {
		// Forget every class: at worst one more line of each, and the counts so far.
		d.last, d.suppressed = map[string]time.Time{}, map[string]int{}
	}
	if now.Sub(d.last[class]) < period {
		d.suppressed[class]++
		return 0, false
	}
	n := d.suppressed[class]
	d.last[class], d.suppressed[class] = now, 0
	return n, true
}
func (l *logger) Debugf(format string, v ...any) { l.debug(format, v...) }
func (l *logger) Tracef(format string, v ...any) { l.debug(format, v...) }

func (l *logger) debug(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(redact(format, v))
	}
}

// userinfo is a URL's user and password: nats-server prints a route's URL whole ("Removed
// route nats-route://route:<secret>@host:port"), and the secret is the mesh's route
// credential.
var userinfo = regexp.MustCompile(`://([^:/@\s]+):[^@/\s]+@`)

// redact formats a nats-server message with every URL's password replaced.
func redact(format string, v []any) string {
	return userinfo.ReplaceAllString(fmt.Sprintf(format, v...), "://$1:REDACTED@")
}

func (l *logger) Fatalf(format string, v ...any) {
	msg := redact(format, v)
	l.mu.Lock()
	if l.fatal == "" {
		l.fatal = msg
	}
	l.mu.Unlock()
	l.log.Error(msg)
}

// fatalMessage returns the first message nats-server logged as fatal, if any.
func (l *logger) fatalMessage() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}
