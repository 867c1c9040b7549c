package mirror

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/nats-io/nats-server/v2/server"
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

// earlyKV is a bucket whose watch says its current values are all in after the first one,
// as the watch's consumer does when it is placed on a replica still catching up.
type earlyKV struct{ jetstream.KeyValue }

func (kv earlyKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := kv.KeyValue.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	early := &earlyWatch{KeyWatcher: w, ch: make(chan jetstream.KeyValueEntry)}
	go func() {
		defer close(early.ch)
		n := 0
		for e := range w.Updates() {
			if e == nil {
				continue // the real marker: said already
			}
			early.ch <- e
			if n++; n == 1 {
				early.ch <- nil
			}
		}
	}()
	return early, nil
}

type earlyWatch struct {
	jetstream.KeyWatcher
	ch chan jetstream.KeyValueEntry
}

func (w *earlyWatch) Updates() <-chan jetstream.KeyValueEntry { return w.ch }

// TestOpen_LoadsToTheLeadersLastSequence: a watch whose "all in" comes early (its consumer on
// a replica still catching up) does not end the load: Open returns once every record up to the
// last sequence the stream's leader reported is applied, where a grown server's registry was
// missing a registered module.
func TestOpen_LoadsToTheLeadersLastSequence(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", History: 3})
	if err != nil {
		t.Fatal(err)
	}
	const keys = 20
	for i := range keys {
		if _, err := kv.Put(ctx, fmt.Sprintf("k%d", i), []byte("1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "k0"); err != nil { // the last message a delete marker
		t.Fatal(err)
	}
	var mu sync.Mutex
	applied := map[string]bool{}
	w, err := Open(ctx, earlyKV{kv}, func(e jetstream.KeyValueEntry) {
		mu.Lock()
		applied[e.Key()] = e.Operation() == jetstream.KeyValuePut
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(applied) != keys || applied["k0"] || !applied[fmt.Sprintf("k%d", keys-1)] {
		t.Fatalf("Open returned with %d of %d keys applied (k0 deleted: %v): %v", len(applied), keys, !applied["k0"], applied)
	}
}
