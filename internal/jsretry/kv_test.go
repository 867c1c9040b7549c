package jsretry_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/internal/testbed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestKV_RidesThroughAnOutage: with the bucket's stream gone from the server (JetStream
// disabled), a write fails as nats.go's own does, but only when its context ends; started
// while the stream is away and given time, it lands once the stream is back.
func TestKV_RidesThroughAnOutage(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: dir})
	_, js := testbed.Connect(t, srv, nats.MaxReconnects(-1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
	kv := jsretry.Wrap(raw)
	if _, err := kv.Put(ctx, "k", []byte("before")); err != nil {
		t.Fatalf("put with the stream up: %v", err)
	}

	cfg := *srv.JetStreamConfig()
	cfg.StoreDir = dir // EnableJetStream adds its "jetstream" again
	if err := srv.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Put(ctx, "k", []byte("raw")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("nats.go's own put with the stream away: %v, want ErrNoStreamResponse", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 700*time.Millisecond)
	started := time.Now()
	_, err = kv.Update(short, "k", []byte("late"), 1)
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), "had no leader") || time.Since(started) < 600*time.Millisecond {
		t.Fatalf("update with the stream away: %v after %s, want a refusal saying so once its context ends", err, time.Since(started))
	}
	t.Logf("the refusal reads: %v", err)

	landed := make(chan error, 1)
	go func() {
		_, err := kv.Put(ctx, "k", []byte("after"))
		landed <- err
	}()
	if err := srv.EnableJetStream(&cfg); err != nil {
		t.Fatal(err)
	}
	if err := <-landed; err != nil {
		t.Fatalf("put started while the stream was away: %v", err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "after" || e.Revision() != 2 {
		t.Fatalf("after the outage the bucket holds %v, want \"after\" at revision 2 (nothing else landed): %v", e, err)
	}
}
