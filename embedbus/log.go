package embedbus

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
)

// logger routes nats-server's printf-style log into slog. Fatalf does not exit: the first
// fatal message is kept so Open can return it as an error.
type logger struct {
	log *slog.Logger

	mu    sync.Mutex
	fatal string
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
func (l *logger) Warnf(format string, v ...any)  { l.log.Warn(redact(format, v)) }
func (l *logger) Errorf(format string, v ...any) { l.log.Error(redact(format, v)) }
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
