package embedbus

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// logger routes nats-server's printf-style log into slog. Fatalf does not exit: the first
// fatal message is kept so Open can return it as an error.
type logger struct {
	log *slog.Logger

	mu    sync.Mutex
	fatal string
}

func (l *logger) Noticef(format string, v ...any) { l.log.Info(fmt.Sprintf(format, v...)) }
func (l *logger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *logger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *logger) Debugf(format string, v ...any)  { l.debug(format, v...) }
func (l *logger) Tracef(format string, v ...any)  { l.debug(format, v...) }

func (l *logger) debug(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, v...))
	}
}

func (l *logger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
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
