package seats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// leaseTTL is short, so the store's tests run in seconds.
const leaseTTL = time.Second

// storeWait bounds each wait for the mirror or the bucket.
const storeWait = 10 * time.Second

// holders records what a store's holder-change hook was told.
type holders struct {
	mu  sync.Mutex
	got []string // "before -> after", each "instance@epoch" or "-"
}

func (h *holders) hook(before, after *Lease) {
	name := func(l *Lease) string {
		if l == nil {
			return "-"
		}
		return fmt.Sprintf("%s@%d", l.Instance, l.Epoch)
	}
	h.mu.Lock()
	h.got = append(h.got, name(before)+" -> "+name(after))
	h.mu.Unlock()
}

func (h *holders) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.got)
}

// openStore opens a store on its own connection to srv, watching until the test ends.
func openStore(t *testing.T, srv *server.Server) (*Store, jetstream.KeyValue) {
	t.Helper()
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), storeWait)
	defer cancel()
	s, err := OpenStore(ctx, js, 1, leaseTTL, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLogger(slog.New(slog.DiscardHandler))
	kv, err := js.KeyValue(ctx, Bucket)
	if err != nil {
		t.Fatal(err)
	}
	run, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(run) }()
	t.Cleanup(func() {
		stop()
		<-done
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, kv
}

func jetStreamServer(t *testing.T) *server.Server {
	t.Helper()
	return testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
}

func jobsLease(node, instance string) Lease {
	return Lease{Seat: "jobs", Scope: manifest.ScopeMesh, Node: node, Module: "worker", Instance: instance, Since: time.Now().UTC()}
}

// mirrors waits until s's mirror holds, at key, a lease that satisfies ok (nil: none).
func mirrors(t *testing.T, s *Store, key string, ok func(Lease) bool) Lease {
	t.Helper()
	var got Lease
	testbed.RetryUntil(t, storeWait, func() error {
		l, found := s.Get(key)
		if ok == nil && !found || ok != nil && found && ok(l) {
			got = l
			return nil
		}
		return fmt.Errorf("the mirror holds %v (found %v) at %s", l, found, key)
	})
	return got
}

// TestStore_Lease: one create wins; a renewal at the lease's revision keeps it (epoch and
// all) and one at a stale revision is refused as lost; a release at a stale revision leaves
// the lease, at its own frees the seat; the epoch of the next lease is higher.
func TestStore_Lease(t *testing.T) {
	srv := jetStreamServer(t)
	s, kv := openStore(t, srv)
	other, _ := openStore(t, srv)
	var seen holders
	other.OnHolderChange(seen.hook)
	ctx, cancel := context.WithTimeout(context.Background(), storeWait)
	defer cancel()

	a := jobsLease("n1", "ia")
	rev, err := s.acquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.acquire(ctx, jobsLease("n2", "ib")); !errors.Is(err, ErrHeld) {
		t.Fatalf("a second acquire: %v, want ErrHeld", err)
	}
	got := mirrors(t, other, "jobs", func(l Lease) bool { return l.Instance == "ia" })
	if got.Epoch != rev || got.Node != "n1" || got.Module != "worker" {
		t.Fatalf("the other mirror holds %+v, want ia's lease at epoch %d", got, rev)
	}

	a.Epoch = rev // what the Runner renews with
	rev2, err := s.renew(ctx, a, rev)
	if err != nil || rev2 <= rev {
		t.Fatalf("renew at %d: %d, %v", rev, rev2, err)
	}
	if _, err := s.renew(ctx, a, rev); !errors.Is(err, ErrLost) {
		t.Fatalf("renew at the stale revision %d: %v, want ErrLost", rev, err)
	}
	if err := s.release(ctx, a, rev); err != nil {
		t.Fatalf("a release at a stale revision is no error: %v", err)
	}
	if e, err := kv.Get(ctx, "jobs"); err != nil || e.Revision() != rev2 {
		t.Fatalf("a release at a stale revision touched the lease: %v, %v", e, err)
	}
	mirrors(t, other, "jobs", func(l Lease) bool { return l.Epoch == rev }) // the renewal is no new epoch

	if err := s.release(ctx, a, rev2); err != nil {
		t.Fatal(err)
	}
	mirrors(t, other, "jobs", nil)
	rev3, err := other.acquire(ctx, jobsLease("n2", "ib"))
	if err != nil {
		t.Fatalf("acquire after the release: %v", err)
	}
	got = mirrors(t, s, "jobs", func(l Lease) bool { return l.Instance == "ib" })
	if got.Epoch != rev3 || rev3 <= rev2 {
		t.Fatalf("the next holder's epoch is %d (acquired at %d), the last one's renewal was at %d", got.Epoch, rev3, rev2)
	}
	// The hook: ia took the seat, its renewal was no change, it let go, ib took it.
	testbed.RetryUntil(t, storeWait, func() error {
		want := []string{fmt.Sprintf("- -> ia@%d", rev), fmt.Sprintf("ia@%d -> -", rev), fmt.Sprintf("- -> ib@%d", rev3)}
		// ib's lease, never renewed, expires after that: a fourth change.
		if got := seen.list(); len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
			return fmt.Errorf("the hook saw %v, want %v first", got, want)
		}
		return nil
	})
}

// TestStore_Expires: a lease nobody renews goes after its TTL: the bucket's marker tells the
// mirror, which shows it stale meanwhile, and the seat is free to create again.
func TestStore_Expires(t *testing.T) {
	srv := jetStreamServer(t)
	s, _ := openStore(t, srv)
	var seen holders
	s.OnHolderChange(seen.hook)
	ch := make(chan string, 16)
	s.Subscribe(ch)
	ctx, cancel := context.WithTimeout(context.Background(), storeWait)
	defer cancel()
	start := time.Now()
	rev, err := s.acquire(ctx, jobsLease("n1", "ia"))
	if err != nil {
		t.Fatal(err)
	}
	mirrors(t, s, "jobs", func(Lease) bool { return true })
	if s.Stale("jobs") && time.Since(start) < leaseTTL {
		t.Fatal("a fresh lease is stale")
	}
	select {
	case key := <-ch:
		if key != "jobs" {
			t.Fatalf("a subscriber was told %q, want jobs", key)
		}
	case <-time.After(storeWait):
		t.Fatal("a subscriber was not told of the new lease")
	}
	mirrors(t, s, "jobs", nil)
	if took := time.Since(start); took < leaseTTL {
		t.Fatalf("the lease went after %s, before its TTL of %s", took, leaseTTL)
	}
	if _, err := s.acquire(ctx, jobsLease("n2", "ib")); err != nil {
		t.Fatalf("acquire after expiry: %v", err)
	}
	want := fmt.Sprintf("ia@%d -> -", rev)
	if got := seen.list(); len(got) < 2 || got[1] != want {
		t.Fatalf("the hook saw %v, want the expiry %q second", got, want)
	}
}

// TestStore_TakeOver deletes only the lease revision the mirror shows: a mirror that lags
// never deletes a lease written since.
func TestStore_TakeOver(t *testing.T) {
	srv := jetStreamServer(t)
	s, kv := openStore(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), storeWait)
	defer cancel()
	if err := s.takeOver(ctx, "jobs"); err != nil {
		t.Fatalf("takeOver of no lease: %v", err)
	}

	l := jobsLease("n1", "ia")
	rev, err := s.acquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	// A store whose watch does not run holds what it loaded and nothing since: a mirror
	// that lags. The lease is renewed behind it.
	_, js := testbed.Connect(t, srv)
	lagging, err := OpenStore(ctx, js, 1, leaseTTL, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lagging.Close()
	if _, ok := lagging.Get("jobs"); !ok {
		t.Fatal("the lagging store did not load the lease")
	}
	l.Epoch = rev
	rev2, err := s.renew(ctx, l, rev)
	if err != nil {
		t.Fatal(err)
	}
	if err := lagging.takeOver(ctx, "jobs"); err != nil {
		t.Fatalf("takeOver from a lagging mirror: %v", err)
	}
	if e, err := kv.Get(ctx, "jobs"); err != nil || e.Revision() != rev2 {
		t.Fatalf("takeOver from a lagging mirror deleted the renewed lease: %v, %v", e, err)
	}

	// A mirror that is up to date deletes it.
	fresh, _ := openStore(t, srv)
	mirrors(t, fresh, "jobs", func(Lease) bool { return true })
	if err := fresh.takeOver(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "jobs"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after takeOver the bucket holds the lease: %v", err)
	}
}

// TestStore_BadRecord: a value that is no lease, or a lease stored under another's key,
// holds no seat: the store deletes it, so a candidate can acquire.
func TestStore_BadRecord(t *testing.T) {
	srv := jetStreamServer(t)
	s, kv := openStore(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), storeWait)
	defer cancel()
	for key, v := range map[string]string{
		"jobs":    "{not json",
		"mailer":  `{"seat":"jobs","scope":"mesh","node":"n1","instance":"x"}`, // jobs's lease at mailer's key
		"builder": `{"seat":"builder","scope":"galaxy","node":"n1","instance":"x"}`,
		"index":   `{"seat":"index","scope":"mesh","instance":"x"}`,
	} {
		if _, err := kv.Put(ctx, key, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	testbed.RetryUntil(t, storeWait, func() error {
		keys, err := kv.Keys(ctx)
		if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
			return err
		}
		if len(keys) > 0 {
			return fmt.Errorf("the bucket still holds %v", keys)
		}
		return nil
	})
	if got := s.All(); len(got) != 0 {
		t.Fatalf("the mirror holds %v", got)
	}
	if _, err := s.acquire(ctx, jobsLease("n1", "ia")); err != nil {
		t.Fatalf("acquire where a bad record was: %v", err)
	}
}

// TestKey: a mesh seat has one lease; a node seat one per node.
func TestKey(t *testing.T) {
	if got := Key("jobs", manifest.ScopeMesh, "n1"); got != "jobs" {
		t.Errorf("mesh scope: %q", got)
	}
	if got := Key("jobs", manifest.ScopeNode, "n1"); got != "jobs.n1" {
		t.Errorf("node scope: %q", got)
	}
	if _, err := decodeLease("jobs.n2", []byte(`{"seat":"jobs","scope":"node","node":"n1","instance":"x"}`)); err == nil || !strings.Contains(err.Error(), "jobs.n1") {
		t.Errorf("n1's node-scoped lease at n2's key: %v", err)
	}
	l := Lease{Seat: "jobs", Node: "n1", Module: "worker", Instance: "i1", Epoch: 7}
	if got, want := l.String(), "jobs held by worker/i1 on n1 (epoch 7)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestStore_LastHeld: a seat a node holds itself is still answered with its last holder
// after the lease is released and the mirror is emptied for a new watch; a module's lease
// is not kept.
func TestStore_LastHeld(t *testing.T) {
	srv := jetStreamServer(t)
	s, _ := openStore(t, srv)
	other, _ := openStore(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), storeWait)
	defer cancel()

	ctl := Lease{Seat: "mesh-controller", Scope: manifest.ScopeMesh, Node: "n1", Since: time.Now().UTC()}
	rev, err := s.acquire(ctx, ctl)
	if err != nil {
		t.Fatal(err)
	}
	mod := jobsLease("n1", "ia")
	modRev, err := s.acquire(ctx, mod)
	if err != nil {
		t.Fatal(err)
	}
	mirrors(t, other, "mesh-controller", func(l Lease) bool { return l.Node == "n1" })
	mirrors(t, other, "jobs", func(l Lease) bool { return l.Instance == "ia" })
	if err := s.release(ctx, ctl, rev); err != nil {
		t.Fatal(err)
	}
	if err := s.release(ctx, mod, modRev); err != nil {
		t.Fatal(err)
	}
	mirrors(t, other, "mesh-controller", nil)
	mirrors(t, other, "jobs", nil)
	other.clear() // what a watch taken up again does first
	if l, ok := other.LastHeld("mesh-controller"); !ok || l.Node != "n1" || l.Epoch != rev {
		t.Fatalf("LastHeld after the release: %+v %v, want n1's lease at epoch %d", l, ok, rev)
	}
	if l, ok := other.LastHeld("jobs"); ok {
		t.Fatalf("LastHeld keeps a module's lease: %+v", l)
	}
	// The next holder is the answer as soon as the mirror sees it.
	ctl2 := ctl
	ctl2.Node = "n2"
	if _, err := s.acquire(ctx, ctl2); err != nil {
		t.Fatal(err)
	}
	testbed.RetryUntil(t, storeWait, func() error {
		if l, _ := other.LastHeld("mesh-controller"); l.Node != "n2" {
			return fmt.Errorf("LastHeld is %+v, want n2's", l)
		}
		return nil
	})
	// Each epoch's holder stays known by its epoch, across the watch taken up again: n1's late
	// event, read once n2 holds the seat, is judged by n1's lease.
	n2, _ := other.LastHeld("mesh-controller")
	for epoch, want := range map[uint64]string{rev: "n1", n2.Epoch: "n2"} {
		l, ended, ok := other.HeldAt("mesh-controller", epoch)
		if !ok || l.Node != want {
			t.Errorf("HeldAt(%d) = %+v %v, want %s's lease", epoch, l, ok, want)
		}
		if ended.IsZero() != (want == "n2") { // n1's ended when the mirror saw n2's
			t.Errorf("HeldAt(%d): %s's lease ended %v", epoch, want, ended)
		}
	}
	if l, _, ok := other.HeldAt("mesh-controller", n2.Epoch+1000); ok {
		t.Errorf("HeldAt an epoch nobody held: %+v", l)
	}
	if l, _, ok := other.HeldAt("jobs", modRev); ok {
		t.Errorf("HeldAt keeps a module's lease: %+v", l)
	}
}

// TestStore_HeldAtIsBounded: renewals are one lease; of many holders the newest heldHistory
// are kept.
func TestStore_HeldAtIsBounded(t *testing.T) {
	s := &Store{heldAt: map[string][]heldLease{}}
	for epoch := uint64(1); epoch <= heldHistory+6; epoch++ {
		for range 3 { // a lease and its renewals
			s.rememberHeld("k", Lease{Node: fmt.Sprint("n", epoch), Epoch: epoch})
		}
	}
	if n := len(s.heldAt["k"]); n != heldHistory {
		t.Fatalf("%d leases kept, want %d", n, heldHistory)
	}
	if _, _, ok := s.HeldAt("k", 6); ok {
		t.Error("the oldest leases are kept past the bound")
	}
	if l, _, ok := s.HeldAt("k", 7); !ok || l.Node != "n7" {
		t.Errorf("HeldAt(7) = %+v %v", l, ok)
	}
}
