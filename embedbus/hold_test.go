package embedbus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// keys is a Directory that admits its keys with every permission; keys may be added, and
// asked counts the questions about each key (a connect's Check asks before it holds).
type keys struct {
	mu    sync.Mutex
	pub   map[string]bool
	asked map[string]int
}

func (k *keys) Identity(pub, _ string) (Identity, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.asked[pub]++
	return Identity{Name: "test"}, k.pub[pub]
}

// awaitAsked waits until the directory was asked about pub n times.
func (k *keys) awaitAsked(t *testing.T, pub string, n int) {
	t.Helper()
	retryUntil(t, 10*time.Second, func() error {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.asked[pub] < n {
			return fmt.Errorf("asked about the key %d times, want %d", k.asked[pub], n)
		}
		return nil
	})
}

func (k *keys) add(pub string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pub[pub] = true
}

func newUser(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	return kp, pub
}

// openIncomplete opens a bus whose directory is complete only once the returned channel is
// closed.
func openIncomplete(t *testing.T, hold time.Duration) (*Bus, *keys, chan struct{}) {
	t.Helper()
	kp, pub := newUser(t)
	dir := &keys{pub: map[string]bool{pub: true}, asked: map[string]int{}}
	complete := make(chan struct{})
	b, err := Open(context.Background(), Config{Name: "n", StoreDir: t.TempDir(), ClientAddr: testbed.FreeAddr(t), Directory: dir, Key: kp,
		Complete: complete, HoldUnknown: hold})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, dir, complete
}

func dial(b *Bus, kp nkeys.KeyPair, timeout time.Duration) error {
	pub, _ := kp.PublicKey()
	nc, err := nats.Connect(b.ClientURL(), nats.Nkey(pub, kp.Sign), nats.MaxReconnects(0), nats.Timeout(timeout))
	if err == nil {
		nc.Close()
	}
	return err
}

// TestHoldUnknown: while the directory is incomplete, a key it does not know is held at
// the door — the client's connect times out, which every client retries — not refused;
// once the directory is complete a held key it now knows is let in, and an unknown key is
// refused at once.
func TestHoldUnknown(t *testing.T) {
	b, dir, complete := openIncomplete(t, time.Minute)
	kp, pub := newUser(t)
	if err := dial(b, kp, 300*time.Millisecond); err == nil || errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("an unknown key while the directory is incomplete: %v, want a connect that times out", err)
	}
	held := make(chan error, 1)
	go func() { held <- dial(b, kp, 10*time.Second) }()
	dir.awaitAsked(t, pub, 2) // the timed-out connect and this one, each held after asking
	dir.add(pub)
	close(complete)
	if err := <-held; err != nil {
		t.Fatalf("a held key the complete directory knows: %v, want connected", err)
	}
	other, _ := newUser(t)
	start := time.Now()
	if err := dial(b, other, 10*time.Second); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("an unknown key once the directory is complete: %v, want refused", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the refusal took %v: it was held", d)
	}
}

// TestHoldUnknown_Bounded: a hold ends after HoldUnknown with a refusal, and closing the
// bus ends every hold at once (goleak checks nothing is left).
func TestHoldUnknown_Bounded(t *testing.T) {
	b, _, _ := openIncomplete(t, 200*time.Millisecond)
	kp, _ := newUser(t)
	if err := dial(b, kp, 10*time.Second); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("an unknown key past the hold: %v, want refused", err)
	}

	long, dir, _ := openIncomplete(t, time.Hour)
	held := make(chan error, 1)
	go func() { held <- dial(long, kp, time.Hour) }()
	pub, _ := kp.PublicKey()
	dir.awaitAsked(t, pub, 1)
	closed := make(chan struct{})
	go func() { long.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a held connect")
	}
	if err := <-held; err == nil {
		t.Fatal("a connect held while the bus closed: connected")
	}
}

var retryUntil = testbed.RetryUntil

// TestClosedConnectionsBounded: the server remembers at most maxClosedClients closed
// connections, not nats-server's 10,000 (0.8 KB of heap each).
func TestClosedConnectionsBounded(t *testing.T) {
	b, dir, complete := openIncomplete(t, time.Second)
	close(complete)
	kp, pub := newUser(t)
	dir.add(pub)
	for range maxClosedClients + 50 {
		if err := dial(b, kp, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	retryUntil(t, 10*time.Second, func() error {
		cz, err := b.srv.Connz(&server.ConnzOptions{State: server.ConnClosed})
		if err != nil {
			return err
		}
		if cz.Total != maxClosedClients {
			return fmt.Errorf("%d closed connections remembered, want %d", cz.Total, maxClosedClients)
		}
		return nil
	})
}
