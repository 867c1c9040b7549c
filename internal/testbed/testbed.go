// Package testbed is what the tests share about where they run. A bed that cannot run on
// this machine skips through Skip, which fails instead where CI says every bed must run: a
// skipped bed there would be a green run that proved nothing.
package testbed

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MustRunEnv is the environment variable CI sets to MustRun: then no bed may skip.
const MustRunEnv = "MESHNODE_BEDS"

// MustRun is MustRunEnv's value in CI.
const MustRun = "must-run"

// Skip skips t, saying why the bed cannot run here, or fails it when MustRunEnv is MustRun.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if os.Getenv(MustRunEnv) == MustRun {
		t.Fatalf("this bed must run here (%s=%s) but cannot: %s", MustRunEnv, MustRun, why)
	}
	t.Skip(why)
}

// FreeAddr returns a loopback address whose port was free a moment ago, for a process the
// test starts later (a port fixed across restarts). The port is drawn from below Linux's
// ephemeral range (32768–60999 by default): a port the kernel handed out as free for a
// listener is the next one it hands to some outgoing connection, and beds that open
// thousands of connections at once took it between the check and the node's bind. No port
// is handed out twice in one test process: two draws of the same port, both free until the
// first node binds it, gave a mesh of seven one client port and another's gossip port.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 200 {
		port := freeLow + rand.IntN(freeHigh-freeLow)
		if !handOut(port) {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// handedOut are the ports FreeAddr has returned in this process.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// handOut marks port as handed out; false if it was already.
func handOut(port int) bool {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports[port] {
		return false
	}
	handedOut.ports[port] = true
	return true
}

// The ports FreeAddr draws from.
const (
	freeLow  = 20000
	freeHigh = 32768
)

// JetStream starts an embedded nats-server with JetStream on a random loopback port, stopped
// when the test ends, and returns its client URL: for a package's tests of its own use of
// JetStream, without a node.
func JetStream(t testing.TB) string {
	t.Helper()
	return NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()}).ClientURL()
}

// NATSServer starts a plain nats-server for t on a random loopback port, with opts' other
// settings (JetStream, say; nil for none), shut down when t ends.
func NATSServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	o := server.Options{}
	if opts != nil {
		o = *opts
	}
	o.Host, o.Port, o.NoSigs, o.NoLog = "127.0.0.1", server.RANDOM_PORT, true, true
	srv, err := server.NewServer(&o)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return srv
}

// Connect connects to srv (a NATSServer) and returns the connection, closed when tb ends,
// and its JetStream context.
func Connect(tb testing.TB, srv *server.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(srv.ClientURL(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return nc, js
}

// RetryUntil polls f until it returns nil, and fails tb with f's last error once timeout has
// passed: how a test waits for a state.
func RetryUntil(tb testing.TB, timeout time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SyncBuffer is a bytes.Buffer safe for a writer (a logger, a process's stderr) and a
// reader in different goroutines.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Len is how many bytes were written so far.
func (b *SyncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

// Passable lets any user pass through dir and the directories above it (o+x, not o+r), as
// a node running as root makes its data dir: a module's own uid must reach its directory.
// It is Traversable for a helper with no test at hand, and returns the first error.
func Passable(dir string) error {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	for p := dir; p != "/" && p != "."; p = filepath.Dir(p) {
		if st, err := os.Stat(p); err == nil && st.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(p, st.Mode().Perm()|0o001); err != nil {
				return err
			}
		}
	}
	return nil
}

// Traversable is Passable that fails t.
func Traversable(t testing.TB, dir string) {
	t.Helper()
	if err := Passable(dir); err != nil {
		t.Fatal(err)
	}
}
