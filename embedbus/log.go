package embedbus

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
)

// logger routes nats-server's printf-style log into slog. Fatalf does not exit: the first
// fatal message is kept so Open can return it as an error.
type logger struct {
	log *slog.Logger

	mu    sync.Mutex
	fatal string
}

func (l *logger) Noticef(format string, v ...any) { l.log.Info(redact(format, v)) }
func (l *logger) Warnf(format string, v ...any)   { l.log.Warn(redact(format, v)) }
func (l *logger) Errorf(format string, v ...any)  { l.log.Error(redact(format, v)) }
func (l *logger) Debugf(format string, v ...any)  { l.debug(format, v...) }
func (l *logger) Tracef(format string, v ...any)  { l.debug(format, v...) }

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
