package embedbus

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"
)

// logger routes nats-server's printf-style log into slog. Fatalf does not exit: the first
// fatal message is kept so Open can return it as an error.
type logger struct {
	log *slog.Logger

	mu    sync.Mutex
	fatal string

	damp damper // the classes of message a flood repeats
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
func (l *logger) Warnf(format string, v ...any) { l.log.Warn(redact(format, v)) }
func (l *logger) Errorf(format string, v ...any) {
	msg := redact(format, v)
	if class := floodClass(msg); class != "" {
		n, ok := l.damp.admit(class, time.Now())
		if !ok {
			return
		}
		if n > 0 {
			l.log.Error(msg, "suppressed", n, "suppressed_what", "lines like this one in the last second")
			return
		}
	}
	l.log.Error(msg)
}

// floodClasses are the messages nats-server logs once per offending message or connect:
// a publish the permissions deny, a refused connect. A module flooding either would flood
// the node's log, so each class is logged at most once a second, with a count.
var floodClasses = []string{" - Publish Violation - ", " - Subscription Violation - ", " - authentication error"}

// floodClass is msg's class of floodClasses, "" for none.
func floodClass(msg string) string {
	for _, c := range floodClasses {
		if strings.Contains(msg, c) {
			return c
		}
	}
	return ""
}

// damper lets one message of a class through a second and counts the others.
type damper struct {
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

// admit reports whether a message of class is logged now, and how many of its class were
// not since the last one that was.
func (d *damper) admit(class string, now time.Time) (suppressed int, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last == nil {
		d.last, d.suppressed = map[string]time.Time{}, map[string]int{}
	}
	if now.Sub(d.last[class]) < time.Second {
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
