package seats_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ttl is short, so the beds run in seconds; the logic scales with it.
const ttl = time.Second

func startServer(t *testing.T) string { return testbed.JetStream(t) }

// node is one node's view of the leases: its own connection, mirror and runner.
type node struct {
	nc     *nats.Conn
	store  *seats.Store
	runner *seats.Runner
	stop   context.CancelFunc
	done   sync.WaitGroup
}

// record is what the hooks saw, in order.
type record struct {
	mu     sync.Mutex
	events []event
}

type event struct {
	node, what string
	epoch      uint64
	at         time.Time
	inBucket   bool // Released: was the lease still in the bucket when the hook ran?
}

func (r *record) add(e event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *record) find(node, what string) (event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.node == node && e.what == what {
			return e, true
		}
	}
	return event{}, false
}

func openNode(t *testing.T, url, name string, rec *record) *node {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := seats.OpenStore(ctx, js, 1, ttl, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{nc: nc, store: store}
	kv, _ := js.KeyValue(ctx, seats.Bucket)
	hooks := seats.Hooks{
		Gained: func(l seats.Lease) { rec.add(event{node: name, what: "gained", epoch: l.Epoch, at: time.Now()}) },
		Lost:   func(l seats.Lease, _ error) { rec.add(event{node: name, what: "lost", epoch: l.Epoch, at: time.Now()}) },
		Released: func(l seats.Lease) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := kv.Get(ctx, l.Seat)
			rec.add(event{node: name, what: "released", epoch: l.Epoch, at: time.Now(), inBucket: err == nil})
		},
	}
	n.runner = seats.NewRunner(store, name, slog.New(slog.DiscardHandler), func(seats.Candidate) bool { return true }, hooks)
	rctx, stop := context.WithCancel(context.Background())
	n.stop = stop
	n.done.Add(2)
	go func() { defer n.done.Done(); store.Watch(rctx) }()
	go func() { defer n.done.Done(); n.runner.Run(rctx) }()
	t.Cleanup(func() {
		n.stop()
		n.done.Wait()
		store.Close()
		nc.Close()
	})
	return n
}

func candidate(instance string) seats.Candidate {
	return seats.Candidate{Seat: "jobs", Scope: manifest.ScopeMesh, Module: "worker", Instance: instance}
}

func waitFor(t *testing.T, rec *record, node, what string, timeout time.Duration) event {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if e, ok := rec.find(node, what); ok {
			return e
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	t.Fatalf("no %s on %s after %s: %+v", what, node, timeout, rec.events)
	return event{}
}

// TestRunner_CutOffHolderLetsGoFirst: the holder's node loses the bus (its connection
// closes, so no renewal can reach the bucket). It must report the lease lost before the
// other node can take it: never two holders, and the next epoch is higher.
func TestRunner_CutOffHolderLetsGoFirst(t *testing.T) {
	url := startServer(t)
	rec := &record{}
	a, b := openNode(t, url, "a", rec), openNode(t, url, "b", rec)
	a.runner.Add(candidate("ia"))
	gainedA := waitFor(t, rec, "a", "gained", 5*time.Second)
	b.runner.Add(candidate("ib"))
	// While a renews, b waits: two TTLs without a second holder.
	time.Sleep(2 * ttl) // a span to observe, not a state to wait for
	if e, ok := rec.find("b", "gained"); ok {
		t.Fatalf("b took the seat while a held it: %+v", e)
	}

	a.nc.Close()
	lostA := waitFor(t, rec, "a", "lost", 5*ttl)
	gainedB := waitFor(t, rec, "b", "gained", 10*ttl)
	if !lostA.at.Before(gainedB.at) {
		t.Fatalf("a reported the lease lost at %s, after b took it at %s", lostA.at.Format(time.StampMicro), gainedB.at.Format(time.StampMicro))
	}
	if gainedB.epoch <= gainedA.epoch {
		t.Fatalf("epoch went from %d to %d", gainedA.epoch, gainedB.epoch)
	}
	t.Logf("a let go %s before b took the seat", gainedB.at.Sub(lostA.at))
}

// holderAndCandidate opens two nodes of one server: a's instance holds the seat, b's waits.
func holderAndCandidate(t *testing.T) (a, b *node, rec *record) {
	url := startServer(t)
	rec = &record{}
	a, b = openNode(t, url, "a", rec), openNode(t, url, "b", rec)
	a.runner.Add(candidate("ia"))
	waitFor(t, rec, "a", "gained", 5*time.Second)
	b.runner.Add(candidate("ib"))
	return a, b, rec
}

// TestRunner_RetireRevokesBeforeFreeing: a leaving node's holder loses its authority (the
// Released hook) while the lease is still in the bucket, so nobody else can hold the seat
// yet; the other node takes it after, and a retired runner takes nothing again.
func TestRunner_RetireRevokesBeforeFreeing(t *testing.T) {
	a, b, rec := holderAndCandidate(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.runner.Retire(ctx)
	released := waitFor(t, rec, "a", "released", time.Second)
	if !released.inBucket {
		t.Fatal("the lease was freed before the holder's authority was taken away")
	}
	gainedB := waitFor(t, rec, "b", "gained", 5*time.Second)
	if !released.at.Before(gainedB.at) {
		t.Fatalf("released at %s, b took it at %s", released.at, gainedB.at)
	}
	// b lets go; the retired runner does not take the seat back.
	b.runner.Remove(ctx, candidate("ib"))
	a.runner.Add(candidate("ia"))
	time.Sleep(2 * ttl) // a span to observe, not a state to wait for
	rec.mu.Lock()
	defer rec.mu.Unlock()
	gains := 0
	for _, e := range rec.events {
		if e.node == "a" && e.what == "gained" {
			gains++
		}
	}
	if gains != 1 {
		t.Fatalf("the retired runner took the seat again: %+v", rec.events)
	}
}

// TestRunner_StopRevokesBeforeFreeing: a stopping node (its runner's context ends) takes
// each holder's authority away (the Released hook) while the lease is still in the bucket,
// then frees it: its bus stays open a while longer, and a holder left consuming there would
// be a second holder beside the next one. An upgrade bed's old holder handled jobs for 1.3 s
// after its node had freed the lease without the hook.
func TestRunner_StopRevokesBeforeFreeing(t *testing.T) {
	a, _, rec := holderAndCandidate(t)

	a.stop()
	a.done.Wait()
	released := waitFor(t, rec, "a", "released", time.Second)
	if !released.inBucket {
		t.Fatal("the stopping node freed the lease before it took the holder's authority away")
	}
	gainedB := waitFor(t, rec, "b", "gained", 5*time.Second)
	if !released.at.Before(gainedB.at) {
		t.Fatalf("released at %s, b took it at %s", released.at.Format(time.StampMicro), gainedB.at.Format(time.StampMicro))
	}
}
