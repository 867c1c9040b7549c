package embedbus

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

func TestWatchStart_LogsProgress(t *testing.T) {
	var buf testbed.SyncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		watchStart(log, "/data/jetstream", 10*time.Millisecond, 0, nil, done)
		close(finished)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "still starting") {
		if time.Now().After(deadline) {
			t.Fatalf("no progress line in 10s: %q", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(done)
	<-finished
	if !strings.Contains(buf.String(), "/data/jetstream") {
		t.Errorf("the progress line does not name the store: %q", buf.String())
	}
}

func TestWatchStart_MemoryLimit(t *testing.T) {
	got := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go watchStart(slog.New(slog.DiscardHandler), "/data/jetstream", time.Hour, 1, func(err error) { got <- err }, done)
	select {
	case err := <-got:
		var mem *ErrStartMemory
		if !errors.As(err, &mem) || mem.Limit != 1 || !strings.Contains(err.Error(), "/data/jetstream") {
			t.Fatalf("watchdog reported %v, want an ErrStartMemory naming the store", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a 1-byte start memory limit did not trip the watchdog")
	}
}
