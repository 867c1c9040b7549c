package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go/jetstream"
)

// TestConnect_AsModule: a client named for its module (sdk.AsModule, or MESH_MODULE as a
// node's host sets it) connects and knows its declarations as one asked first does; an
// AsModule name that is not the seed's module is refused at once, saying whose seed it is,
// while a wrong MESH_MODULE (inherited by a process a module starts) is only a hint; an
// empty name changes nothing.
func TestConnect_AsModule(t *testing.T) {
	b := newBed(t)
	seed, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	b.register("module: other\nrequires: [mesh-bus]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	named := b.client(seed, sdk.AsModule("a"))
	if named.Module() != "a" {
		t.Fatalf("named client's module %q", named.Module())
	}
	if _, err := named.Emit(ctx, "order.placed", map[string]int{"n": 1}); err != nil {
		t.Fatalf("emit as the named client: %v", err)
	}
	t.Setenv("MESH_MODULE", "a")
	if c := b.client(seed); c.Module() != "a" {
		t.Fatalf("MESH_MODULE client's module %q", c.Module())
	}
	for _, wrong := range []string{"other", "nobody"} {
		start := time.Now()
		_, err := sdk.Connect(ctx, b.n.ClientURL(), seed, sdk.AsModule(wrong))
		if err == nil || !strings.Contains(err.Error(), "is module a's, not "+wrong+"'s") {
			t.Fatalf("AsModule(%s) with a's seed: %v", wrong, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the refusal of a wrong name took %s", took)
		}
		t.Setenv("MESH_MODULE", wrong)
		if c := b.client(seed); c.Module() != "a" {
			t.Fatalf("MESH_MODULE=%s with a's seed: module %q", wrong, c.Module())
		}
	}
	t.Setenv("MESH_MODULE", "")
	if c := b.client(seed, sdk.AsModule("")); c.Module() != "a" {
		t.Fatalf("unnamed client's module %q", c.Module())
	}
}

// TestStreams_ManyConsumers: a stream takes more than nats-server's default cap of 1,000
// consumers (every consuming module is one on EVENTS).
func TestStreams_ManyConsumers(t *testing.T) {
	b := newBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "MANY", Subjects: []string{"many.>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1001 {
		if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: fmt.Sprintf("c%d", i), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatalf("consumer %d: %v", i+1, err)
		}
	}
}
