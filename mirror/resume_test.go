package mirror

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/meshnode/meshnode/internal/testbed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAwaiting_ResumesALostConsumer: the watch's ordered consumer is deleted under it, as it
// is when its server dies. nats.go would notice only after two missed heartbeats (10–20 s);
// an owner awaiting its write gets the watch resumed after Stall, and its write arrives, once,
// with the entries before it untouched: for a watch of the whole bucket and for one of keys
// (nats.go rewrites a filter's keys in place: the resumed watch must not get them twice).
func TestAwaiting_ResumesALostConsumer(t *testing.T) {
	t.Run("all", func(t *testing.T) { testResume(t) })
	t.Run("keys", func(t *testing.T) { testResume(t, "a", "b", "c") })
}

func testResume(t *testing.T, keys ...string) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	applied := map[string][]string{} // key: the values applied, in order
	seen := func(key string) []string {
		mu.Lock()
		defer mu.Unlock()
		return applied[key]
	}
	w, err := Open(ctx, kv, func(e jetstream.KeyValueEntry) {
		mu.Lock()
		applied[e.Key()] = append(applied[e.Key()], string(e.Value()))
		mu.Unlock()
	}, keys...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	defer func() {
		stopRun()
		<-ran
		w.Close()
		if err := w.Resume(); err != ErrClosed {
			t.Errorf("Resume after Close: %v, want ErrClosed", err)
		}
	}()

	// The consumer goes, as with its server.
	stream, err := js.Stream(ctx, "KV_b")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range stream.ConsumerNames(ctx).Name() {
		names = append(names, name)
	}
	if len(names) != 1 {
		t.Fatalf("the bucket has consumers %v, want the watch's one", names)
	}
	if err := js.DeleteConsumer(ctx, "KV_b", names[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "b", []byte("2")); err != nil {
		t.Fatal(err)
	}
	// Blind: within the stall the write does not arrive.
	for end := time.Now().Add(Stall / 2); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if v := seen("b"); len(v) > 0 {
			t.Fatalf("the write arrived with the watch's consumer gone: %v (the bed no longer shows the loss)", v)
		}
	}

	var reports []error // written by Awaiting's goroutine, read after done
	done := w.Awaiting(ctx, func(err error) { reports = append(reports, err) })
	arrived := func(key string) func() error {
		return func() error {
			if len(seen(key)) == 0 {
				return fmt.Errorf("the write of %s has not arrived", key)
			}
			return nil
		}
	}
	testbed.RetryUntil(t, 5*time.Second, arrived("b")) // well inside nats.go's own 10–20 s
	done()
	if len(reports) == 0 || reports[0] != nil {
		t.Fatalf("reports of the resumption: %v, want a success first", reports)
	}
	if _, err := kv.Put(ctx, "c", []byte("3")); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, 5*time.Second, arrived("c"))
	if got := fmt.Sprint(seen("a"), seen("b"), seen("c")); got != "[1] [2] [3]" {
		t.Fatalf("applied a, b, c: %s, want each once", got)
	}
}
