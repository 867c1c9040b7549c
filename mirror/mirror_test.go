package mirror

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// closedWatch is a watch whose updates have ended.
type closedWatch struct{ ch chan jetstream.KeyValueEntry }

func (w closedWatch) Updates() <-chan jetstream.KeyValueEntry { return w.ch }
func (w closedWatch) Stop() error                             { return nil }

// TestFollow_ClosedIsNotAStop: a watch that closes on its own is ErrClosed, so its owner's
// actor ends as a failure; one closed because the context ended is a stop.
func TestFollow_ClosedIsNotAStop(t *testing.T) {
	w := closedWatch{make(chan jetstream.KeyValueEntry)}
	close(w.ch)
	if err := follow(context.Background(), w, func(jetstream.KeyValueEntry) {}); !errors.Is(err, ErrClosed) {
		t.Errorf("a watch that closed on its own: %v, want ErrClosed", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := follow(ctx, w, func(jetstream.KeyValueEntry) {}); err != nil {
		t.Errorf("a watch closed after the context ended: %v, want nil", err)
	}
}
