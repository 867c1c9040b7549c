package node

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestActorDone: an actor that ends while its context is alive failed, named — with its own
// error, or "stopped unexpectedly" when it returned none (before, the node then stopped with
// exit 0); one that ends after its context did was stopped.
func TestActorDone(t *testing.T) {
	t.Parallel()
	alive := context.Background()
	if err := actorDone(alive, "registry watch", nil); err == nil || !strings.Contains(err.Error(), "registry watch: stopped unexpectedly") {
		t.Errorf("nil while alive: %v", err)
	}
	boom := errors.New("boom")
	if err := actorDone(alive, "audit logger", boom); !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "audit logger: ") {
		t.Errorf("an error while alive: %v", err)
	}
	stopped, cancel := context.WithCancel(alive)
	cancel()
	if err := actorDone(stopped, "drift check", boom); err != nil {
		t.Errorf("after the stop: %v, want nil", err)
	}
}
