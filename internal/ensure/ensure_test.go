package ensure_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEnsure: each kind is created when absent, left as it is by an equal configuration, and
// updated to another one.
func TestEnsure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect(testbed.JetStream(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)

	for _, maxMsgs := range []int64{10, 10, 20} {
		s, err := ensure.Stream(ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxMsgs: maxMsgs})
		if err != nil {
			t.Fatalf("stream with MaxMsgs %d: %v", maxMsgs, err)
		}
		if got := s.CachedInfo().Config.MaxMsgs; got != maxMsgs {
			t.Fatalf("stream has MaxMsgs %d, want %d", got, maxMsgs)
		}
	}
	for _, history := range []uint8{1, 1, 5} {
		kv, err := ensure.KeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: "b", History: history})
		if err != nil {
			t.Fatalf("bucket with history %d: %v", history, err)
		}
		st, _ := kv.Status(ctx)
		if st.History() != int64(history) {
			t.Fatalf("bucket keeps %d, want %d", st.History(), history)
		}
	}
	for _, desc := range []string{"one", "one", "two"} {
		obs, err := ensure.ObjectStore(ctx, js, jetstream.ObjectStoreConfig{Bucket: "o", Description: desc})
		if err != nil {
			t.Fatalf("object store %q: %v", desc, err)
		}
		st, _ := obs.Status(ctx)
		if st.Description() != desc {
			t.Fatalf("object store says %q, want %q", st.Description(), desc)
		}
	}
}

// TestEnsure_LargeOnStandalone: a standalone server refuses a create of an existing stream
// that reserves most of its store as if the store were full (it counts the reservation
// before it looks at the name, whether the configuration is equal or not); ensure updates it
// instead. A stream that truly does not fit is still refused with the server's own reason.
func TestEnsure_LargeOnStandalone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, JetStreamMaxStore: 1 << 30, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	// Not the account's only stream: nats-server removes an emptied streams directory in the
	// background after a delete, racing the next create (2.15.2).
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "keep", Subjects: []string{"keep"}}); err != nil {
		t.Fatal(err)
	}
	const big = 700 << 20
	for _, age := range []time.Duration{time.Hour, 2 * time.Hour} {
		if _, err := ensure.Stream(ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxBytes: big, MaxAge: age}); err != nil {
			t.Fatalf("stream of 700 MiB in a 1 GiB store: %v", err)
		}
	}
	js.DeleteStream(ctx, "S")
	for _, history := range []uint8{1, 2} {
		if _, err := ensure.KeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: "b", MaxBytes: big, History: history}); err != nil {
			t.Fatalf("bucket of 700 MiB in a 1 GiB store: %v", err)
		}
	}
	js.DeleteKeyValue(ctx, "b")
	for _, desc := range []string{"one", "two"} {
		if _, err := ensure.ObjectStore(ctx, js, jetstream.ObjectStoreConfig{Bucket: "o", MaxBytes: big, Description: desc}); err != nil {
			t.Fatalf("object store of 700 MiB in a 1 GiB store: %v", err)
		}
	}
	var apiErr *jetstream.APIError
	_, err := ensure.Stream(ctx, js, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, MaxBytes: big})
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.ErrorCode(server.JSStorageResourcesExceededErr) {
		t.Fatalf("a stream that does not fit: %v, want the server's insufficient storage", err)
	}
}
