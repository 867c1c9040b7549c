package seats_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// holdWait bounds each wait for a hook or the bucket.
const holdWait = 10 * time.Second

// hookLog is what a Runner's hooks were told.
type hookLog struct {
	mu                     sync.Mutex
	gained, released, lost []seats.Lease
	lostErr                []error
}

func (h *hookLog) hooks() seats.Hooks {
	return seats.Hooks{
		Gained:   func(l seats.Lease) { h.mu.Lock(); h.gained = append(h.gained, l); h.mu.Unlock() },
		Released: func(l seats.Lease) { h.mu.Lock(); h.released = append(h.released, l); h.mu.Unlock() },
		Lost: func(l seats.Lease, err error) {
			h.mu.Lock()
			h.lost, h.lostErr = append(h.lost, l), append(h.lostErr, err)
			h.mu.Unlock()
		},
	}
}

// nth waits until the hook list picked has at least n entries and returns the nth (from 1).
func (h *hookLog) nth(t *testing.T, what string, n int) seats.Lease {
	t.Helper()
	var l seats.Lease
	testbed.RetryUntil(t, holdWait, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		list := map[string][]seats.Lease{"gained": h.gained, "released": h.released, "lost": h.lost}[what]
		if len(list) < n {
			return fmt.Errorf("%d %s, want %d (gained %v released %v lost %v)", len(list), what, n, h.gained, h.released, h.lost)
		}
		l = list[n-1]
		return nil
	})
	return l
}

func (h *hookLog) count(what string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(map[string][]seats.Lease{"gained": h.gained, "released": h.released, "lost": h.lost}[what])
}

// holderNode is one node's leases: its connection, store and Runner.
type holderNode struct {
	nc     *nats.Conn
	kv     jetstream.KeyValue
	store  *seats.Store
	runner *seats.Runner
	log    *hookLog
	stop   func() // ends Run (which releases every lease) and the watch, and waits for them
}

// newHolderNode makes node's store and Runner on srv; run starts the watch and the Runner,
// until the test ends or stop.
func newHolderNode(t *testing.T, srv *server.Server, node string, ttl time.Duration, alive func(seats.Candidate) bool, run bool) *holderNode {
	t.Helper()
	nc, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), holdWait)
	defer cancel()
	store, err := seats.OpenStore(ctx, js, 1, ttl, 0)
	if err != nil {
		t.Fatal(err)
	}
	store.SetLogger(slog.New(slog.DiscardHandler))
	kv, err := js.KeyValue(ctx, seats.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if alive == nil {
		alive = func(seats.Candidate) bool { return true }
	}
	n := &holderNode{nc: nc, kv: kv, store: store, log: &hookLog{}}
	n.runner = seats.NewRunner(store, node, slog.New(slog.DiscardHandler), alive, n.log.hooks())
	rctx, end := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if run {
		wg.Add(2)
		go func() { defer wg.Done(); store.Watch(rctx) }()
		go func() { defer wg.Done(); n.runner.Run(rctx) }()
	}
	var once sync.Once
	n.stop = func() {
		once.Do(func() {
			end()
			wg.Wait()
			store.Close()
		})
	}
	t.Cleanup(n.stop)
	return n
}

func worker(instance string) seats.Candidate {
	return seats.Candidate{Seat: "jobs", Scope: manifest.ScopeMesh, Module: "worker", Instance: instance}
}

// TestRunner_HoldsAndReleasesOnStop: a candidate gets the lease with its epoch, the Runner
// renews it (a new revision, the same epoch) for as long as it runs, and a stopping Runner
// takes the holder's authority away and frees the lease at once rather than leaving it to
// expire.
func TestRunner_HoldsAndReleasesOnStop(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	a := newHolderNode(t, srv, "n1", seats.DefaultTTL, nil, true) // renewed every second
	a.runner.Add(worker("ia"))
	gained := a.log.nth(t, "gained", 1)
	if gained.Instance != "ia" || gained.Node != "n1" || gained.Epoch == 0 {
		t.Fatalf("gained %+v", gained)
	}
	if l, ok := a.runner.Holds(worker("ia")); !ok || l.Epoch != gained.Epoch {
		t.Fatalf("Holds(ia) = %+v, %v", l, ok)
	}
	if _, ok := a.runner.Holds(worker("ib")); ok {
		t.Fatal("Holds(ib), which never asked")
	}
	ctx, cancel := context.WithTimeout(context.Background(), holdWait)
	defer cancel()
	// Renewed: the bucket's revision moves on, the epoch stays.
	testbed.RetryUntil(t, holdWait, func() error {
		e, err := a.kv.Get(ctx, "jobs")
		if err != nil {
			return err
		}
		if e.Revision() <= gained.Epoch {
			return fmt.Errorf("the lease is at revision %d, acquired at %d", e.Revision(), gained.Epoch)
		}
		return nil
	})
	if l, ok := a.store.Get("jobs"); !ok || l.Epoch != gained.Epoch || l.Instance != "ia" {
		t.Fatalf("after renewals the mirror holds %+v, want epoch %d", l, gained.Epoch)
	}
	if n := a.log.count("lost"); n != 0 {
		t.Fatalf("a renewed lease was lost %d times", n)
	}

	a.stop()
	if _, err := a.kv.Get(ctx, "jobs"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after Run returned the lease is still in the bucket: %v", err)
	}
	if n := a.log.count("released"); n != 1 {
		t.Fatalf("a stopping Runner ran the Released hook %d times, want once: the holder's authority goes before its lease", n)
	}
}

// TestRunner_RemoveHandsOver: a withdrawn holder loses its authority (Released, while the
// lease is still in the bucket) and the next candidate takes the seat at a higher epoch,
// without waiting for the TTL.
func TestRunner_RemoveHandsOver(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	const long = time.Minute // the handover cannot be the lease running out
	a := newHolderNode(t, srv, "n1", long, nil, true)
	a.runner.Add(worker("ia"))
	first := a.log.nth(t, "gained", 1)
	a.runner.Add(worker("ib"))
	ctx, cancel := context.WithTimeout(context.Background(), holdWait)
	defer cancel()
	a.runner.Remove(ctx, worker("ia"))
	if released := a.log.nth(t, "released", 1); released.Instance != "ia" || released.Epoch != first.Epoch {
		t.Fatalf("released %+v, want ia at epoch %d", released, first.Epoch)
	}
	next := a.log.nth(t, "gained", 2)
	if next.Instance != "ib" || next.Epoch <= first.Epoch {
		t.Fatalf("after ia left, gained %+v; want ib at an epoch above %d", next, first.Epoch)
	}
	if _, ok := a.runner.Holds(worker("ia")); ok {
		t.Fatal("the removed ia still holds the seat")
	}
	// Removing a candidate that holds nothing frees nothing.
	a.runner.Remove(ctx, worker("ia"))
	if _, ok := a.runner.Holds(worker("ib")); !ok {
		t.Fatal("removing ia again cost ib the seat")
	}
}

// TestRunner_LostLease: a lease taken from under its holder (deleted and created by another)
// is reported lost at the next renewal, with ErrLost, and the holder no longer holds it.
func TestRunner_LostLease(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	a := newHolderNode(t, srv, "n1", seats.DefaultTTL, nil, true) // lost at a renewal, not by expiry
	a.runner.Add(worker("ia"))
	gained := a.log.nth(t, "gained", 1)

	ctx, cancel := context.WithTimeout(context.Background(), holdWait)
	defer cancel()
	if err := a.kv.Delete(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
	thief := `{"seat":"jobs","scope":"mesh","node":"n2","instance":"thief"}`
	if _, err := a.kv.Create(ctx, "jobs", []byte(thief)); err != nil {
		t.Fatal(err)
	}
	lost := a.log.nth(t, "lost", 1)
	if lost.Epoch != gained.Epoch {
		t.Fatalf("lost %+v, want the lease of epoch %d", lost, gained.Epoch)
	}
	a.log.mu.Lock()
	err := a.log.lostErr[0]
	a.log.mu.Unlock()
	if !errors.Is(err, seats.ErrLost) {
		t.Fatalf("lost with %v, want ErrLost", err)
	}
	if _, ok := a.runner.Holds(worker("ia")); ok {
		t.Fatal("ia still holds the lease it lost")
	}
	if e, err := a.kv.Get(ctx, "jobs"); err != nil || string(e.Value()) != thief {
		t.Fatalf("the losing holder wrote over the new lease: %v, %v", e, err)
	}
}

// TestRunner_DeadCandidate: a candidate whose connection has gone is dropped after about a
// second and its lease released, with the Released hook.
func TestRunner_DeadCandidate(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	var dead atomic.Bool
	a := newHolderNode(t, srv, "n1", time.Minute, func(seats.Candidate) bool { return !dead.Load() }, true)
	a.runner.Add(worker("ia"))
	a.log.nth(t, "gained", 1)
	dead.Store(true)
	if released := a.log.nth(t, "released", 1); released.Instance != "ia" {
		t.Fatalf("released %+v", released)
	}
	ctx, cancel := context.WithTimeout(context.Background(), holdWait)
	defer cancel()
	testbed.RetryUntil(t, holdWait, func() error {
		if _, err := a.kv.Get(ctx, "jobs"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("the dead candidate's lease is still in the bucket: %v", err)
		}
		return nil
	})
	if n := a.log.count("gained"); n != 1 {
		t.Fatalf("the dead candidate was given the seat again (%d gains)", n)
	}
}

// TestRunner_NodeScope: a node-scoped seat has a holder on every node at once.
func TestRunner_NodeScope(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	a := newHolderNode(t, srv, "n1", seats.DefaultTTL, nil, true)
	b := newHolderNode(t, srv, "n2", seats.DefaultTTL, nil, true)
	c := seats.Candidate{Seat: "builder", Scope: manifest.ScopeNode, Module: "build", Instance: "i"}
	a.runner.Add(c)
	b.runner.Add(c)
	ga, gb := a.log.nth(t, "gained", 1), b.log.nth(t, "gained", 1)
	if ga.Node != "n1" || gb.Node != "n2" || ga.Epoch == gb.Epoch {
		t.Fatalf("gained %+v and %+v", ga, gb)
	}
	testbed.RetryUntil(t, holdWait, func() error {
		for _, key := range []string{"builder.n1", "builder.n2"} {
			if _, ok := a.store.Get(key); !ok {
				return fmt.Errorf("n1's mirror holds no %s", key)
			}
		}
		return nil
	})
}

// TestRunner_TakesOverItsLeftover: a node that stopped without releasing (a crash) and
// comes back faster than the TTL takes its own leftover lease over at once, rather than
// waiting for it to expire; Acquire takes it before Run.
func TestRunner_TakesOverItsLeftover(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	const long = time.Minute // the leftover cannot expire during the test
	ctx, cancel := context.WithTimeout(context.Background(), holdWait)
	defer cancel()
	crashed := newHolderNode(t, srv, "n1", long, nil, false)
	crashed.runner.Add(worker("ia"))
	crashed.runner.Acquire(ctx)
	left, ok := crashed.runner.Holds(worker("ia"))
	if !ok {
		t.Fatal("Acquire did not take the free seat")
	}
	crashed.nc.Close() // gone without a release

	// Another node cannot take it: the lease is fresh.
	other := newHolderNode(t, srv, "n2", long, nil, false)
	other.runner.Add(worker("ib"))
	other.runner.Acquire(ctx)
	if _, ok := other.runner.Holds(worker("ib")); ok {
		t.Fatal("another node took a live lease")
	}

	back := newHolderNode(t, srv, "n1", long, nil, false)
	back.runner.Add(worker("ia"))
	back.runner.Acquire(ctx)
	l, ok := back.runner.Holds(worker("ia"))
	if !ok {
		t.Fatal("the restarted node did not take over its leftover lease")
	}
	if l.Epoch <= left.Epoch {
		t.Fatalf("the lease taken over has epoch %d, the leftover %d", l.Epoch, left.Epoch)
	}
}
