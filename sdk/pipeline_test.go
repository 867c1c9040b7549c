package sdk

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
)

// TestEmitAsync_Bounded: against a real nats-server where the event's subject is heard and
// never answered (no stream), EmitAsync sends MaxInFlight events, then waits for a slot and
// gives up with its context; Flush says how many are unanswered; Close settles every one
// with an error naming its event.
func TestEmitAsync_Bounded(t *testing.T) {
	srv := testbed.NATSServer(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	sink, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	var heard atomic.Int64
	if _, err := sink.Subscribe(manifest.AdmitSubject("a", "mesh.mod.a.event.x"), func(*nats.Msg) { heard.Add(1) }); err != nil {
		t.Fatal(err)
	}
	sink.Flush()
	c := bareClient(t, nc, "a", "x")

	ctx := context.Background()
	var sent []*Pending
	for i := range MaxInFlight {
		p, err := c.EmitAsync(ctx, "x", map[string]int{"n": i})
		if err != nil {
			t.Fatalf("EmitAsync %d: %v", i, err)
		}
		sent = append(sent, p)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.EmitAsync(short, "x", "{}"); err == nil || !strings.Contains(err.Error(), "waiting for a slot") {
		t.Fatalf("EmitAsync past MaxInFlight: %v, want it to wait for a slot and give up", err)
	}
	if _, err := c.EmitAsync(ctx, "y", "{}"); err == nil || !strings.Contains(err.Error(), "does not emit") {
		t.Errorf("EmitAsync of an undeclared event: %v", err)
	}
	for _, p := range sent {
		if p.Err() != nil {
			t.Fatalf("event %s failed before any answer: %v", p.ID(), p.Err())
		}
	}
	if err := c.Flush(short); err == nil || !strings.Contains(err.Error(), "1024 events not answered") {
		t.Errorf("Flush with nothing answered: %v", err)
	}
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Every event was sent, not just queued: the subscriber heard each.
	for deadline := time.Now().Add(10 * time.Second); heard.Load() < MaxInFlight; {
		if time.Now().After(deadline) {
			t.Fatalf("the subject heard %d of %d events", heard.Load(), MaxInFlight)
		}
		if err := sink.Flush(); err != nil { // a round trip: what the server had sent is in
			t.Fatal(err)
		}
	}
	c.nc.Close()
	c.abandonInflight()
	for _, p := range sent {
		select {
		case <-p.Done():
		default:
			t.Fatalf("event %s not settled after Close", p.ID())
		}
		if err := p.Wait(ctx); err == nil || !strings.Contains(err.Error(), p.ID()) {
			t.Fatalf("event %s after Close: %v, want an error naming it", p.ID(), err)
		}
	}
	c.cancel()
}

// TestEmitAsync_BoundedInBytes: against a subject heard and never answered, EmitAsync sends
// events of 500 KB until MaxInFlightBytes of them are unanswered, then waits for room and gives
// up with its context — well before MaxInFlight events: a pipeline of big events is what cut a
// node's admitter off (the server holds 64 MiB for a connection at most).
func TestEmitAsync_BoundedInBytes(t *testing.T) {
	srv := testbed.NATSServer(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sink, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if _, err := sink.Subscribe(manifest.AdmitSubject("a", "mesh.mod.a.event.x"), func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	sink.Flush()
	c := bareClient(t, nc, "a", "x")
	big := strings.Repeat("b", 500_000)
	sent := 0
	for ; sent < MaxInFlight; sent++ {
		short, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.EmitAsync(short, "x", big)
		cancel()
		if err != nil {
			if !strings.Contains(err.Error(), "bytes of events unanswered") {
				t.Fatalf("EmitAsync %d: %v, want it to wait for room and give up", sent, err)
			}
			break
		}
	}
	if most := MaxInFlightBytes / 500_000; sent != most {
		t.Fatalf("%d events of 500 KB went unanswered before EmitAsync waited, want %d (MaxInFlightBytes)", sent, most)
	}
	// The room is freed as events are answered: here, abandoned.
	c.nc.Close()
	c.abandonInflight()
	if n := c.pipeline.bytes.TryAcquire(MaxInFlightBytes); !n {
		t.Fatal("the pipeline's bytes were not freed as its events were settled")
	}
	c.cancel()
}
