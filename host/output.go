package host

import (
	"errors"
	"os"
	"sync"
)

// outputLog is a module's output log, written by all its instances: when a write would take
// it past max bytes it is rotated (the old one kept as <path>.1), while the processes run.
type outputLog struct {
	path string
	max  int64

	mu   sync.Mutex
	f    *os.File
	size int64
}

// openOutputLog opens the log at path for appending, rotated first if it is past max.
func openOutputLog(path string, max int64) (*outputLog, error) {
	l := &outputLog{path: path, max: max}
	if st, err := os.Stat(path); err == nil && st.Size() >= max {
		os.Rename(path, path+".1")
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	l.f, l.size = f, st.Size()
	return l, nil
}

// Write appends p, rotating the log first when p would take it past its bound (or starting
// it again where it was deleted by hand). It never fails: a write the disk refuses (full,
// say) drops p, for an error here would end the copy from the processes' pipe, and their
// next write would kill them with SIGPIPE.
func (l *outputLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size > 0 && l.size+int64(len(p)) > l.max {
		renamed := os.Rename(l.path, l.path+".1")
		if renamed == nil || errors.Is(renamed, os.ErrNotExist) {
			f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			switch {
			case err == nil:
				l.f.Close()
				l.f, l.size = f, 0
			case renamed == nil:
				os.Rename(l.path+".1", l.path) // back: written on where the logs tool reads it
			}
		}
	}
	n, _ := l.f.Write(p)
	l.size += int64(n)
	return len(p), nil
}

// Close closes the log's file.
func (l *outputLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}
