package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/sandbox"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/node"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	sandbox.Launcher() // a node in this test binary starts the binary as its launcher
	if os.Getenv(crashingHolderEnv) != "" {
		// This test binary, started again by a bed, is a module process.
		crashingHolder()
		return
	}
	if os.Getenv(floodAttackerEnv) != "" {
		attackerProcess()
		return
	}
	if os.Getenv(uiHolderEnv) != "" {
		uiHolder()
		return
	}
	// The beds mostly wait (a node's open, JetStream's leaders, redeliveries, back-offs): the
	// package's tests took 113 s of wall time for 22 s of CPU one at a time. Each runs its own
	// node on its own ports and data dir, so they run in parallel, more of them than there
	// are cores, unless -test.parallel is given.
	flag.Parse()
	parallelGiven := false
	flag.Visit(func(f *flag.Flag) { parallelGiven = parallelGiven || f.Name == "test.parallel" })
	if !parallelGiven {
		flag.Set("test.parallel", "8")
	}
	// nats.go v1.55.0's object store Put starts a publisher goroutine that reads its status
	// channel after Put's deferred cleanup may have set it to nil, and then blocks for ever
	// (jetstream/object.go: defer cleanupReplySub; publish.go: resetPendingAcksOnReconnect).
	// The beds store artifacts with Put; the node itself never calls it.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

// testConfig returns a single-node configuration on free loopback ports in dir.
func testConfig(dir, name string) config.Config {
	testbed.Passable(dir) // a root node's modules run as uids of their own, which must reach it
	c := config.Up()
	c.DataDir = dir
	c.Name = name
	c.ClientAddr = "127.0.0.1:0"
	c.HTTPAddr = "127.0.0.1:0"
	return c
}

// runningNode is a node whose Run loop is going; stop ends it and closes the node.
type runningNode struct {
	*node.Node
	stop func()
	log  *testbed.SyncBuffer // what the node logged, text, from Info up (Debug up with MESHNODE_TEST_LOG)
}

// MustOpenNode opens and runs a node for cfg, stopping it at cleanup.
func MustOpenNode(tb testing.TB, cfg config.Config) *runningNode {
	tb.Helper()
	buf := &testbed.SyncBuffer{} // the node's log from Info up, for a test to read
	var log *slog.Logger
	if os.Getenv("MESHNODE_TEST_LOG") != "" { // the node's whole log, when debugging a test
		log = slog.New(slog.NewTextHandler(io.MultiWriter(os.Stderr, buf), &slog.HandlerOptions{Level: slog.LevelDebug}))
	} else { // printed if the test fails
		log = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
		tb.Cleanup(func() {
			if tb.Failed() {
				tb.Logf("the node's log:\n%s", buf.String())
			}
		})
	}
	n := node.New(cfg, log)
	n.CreateIdentity = true
	if err := n.Open(); err != nil {
		tb.Fatalf("open node: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	var stopped bool
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("run: %v", err)
		}
		if err := n.Close(); err != nil {
			tb.Errorf("close: %v", err)
		}
	}
	tb.Cleanup(stop)
	return &runningNode{Node: n, stop: stop, log: buf}
}

// retryUntil polls f until it returns nil or the timeout passes.
var retryUntil = testbed.RetryUntil

// connect opens a client connection authenticated with the nkey seed in seedFile.
func connect(tb testing.TB, url, seedFile string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		tb.Fatal(err)
	}
	quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}) // tests read LastError
	nc, err := nats.Connect(url, append([]nats.Option{opt, quiet}, opts...)...)
	if err != nil {
		tb.Fatalf("connect with %s: %v", filepath.Base(seedFile), err)
	}
	return nc
}

func httpGet(tb testing.TB, url string) (int, string) {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestNode_OpenRunClose(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n := MustOpenNode(t, testConfig(dir, "alpha"))

	if code, body := httpGet(t, n.HTTPURL()+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz=%d %s", code, body)
	}
	if code, body := httpGet(t, n.HTTPURL()+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz=%d %s", code, body)
	}

	// Without an nkey the bus refuses the connection.
	if nc, err := nats.Connect(n.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("an unauthenticated client connected")
	}
	// A plain nats.go client with the operator's seed publishes to JetStream on the node.
	nc := connect(t, n.ClientURL(), filepath.Join(dir, datadir.OperatorSeedFile))
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "t.one", []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ack.Sequence, uint64(1); got != want {
		t.Fatalf("ack sequence=%d, want %d", got, want)
	}

	_, metrics := httpGet(t, n.HTTPURL()+"/metrics")
	for _, want := range []string{
		"meshnode_build_info{", "meshnode_uptime_seconds", "meshnode_bus_connections 7", // the node, its two responders, its dead-letter writer, its admitter, the vault, this client
		"meshnode_jetstream_messages", "meshnode_jetstream_bytes",
		"meshnode_jetstream_streams 12", // OBJ_mesh-artifacts, OBJ_mesh-sources, KV_mesh-provisions, EVENTS, STATE, DEAD, KV_mesh-registry, KV_mesh-seats, KV_mesh-vault, SEAT_mesh-controller, SEAT_mesh-build-machine, T
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	st := n.Status(ctx)
	if !st.Ready || st.Name != "alpha" || st.MeshID == "" || st.ClientURL != n.ClientURL() || st.JetStream.Messages < 1 || st.JetStream.Streams != 12 {
		t.Fatalf("status=%+v", st)
	}

	// node.json lets client verbs find the node; it goes when the node stops.
	info, err := datadir.ReadInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.ClientURL != n.ClientURL() || info.HTTPURL != n.HTTPURL() || info.PID != os.Getpid() {
		t.Fatalf("node.json=%+v", info)
	}
	n.stop()
	if _, err := datadir.ReadInfo(dir); !errors.Is(err, datadir.ErrNotRunning) {
		t.Fatalf("after stop ReadInfo err=%v, want datadir.ErrNotRunning", err)
	}
}

func TestNode_SeveralInOneProcess(t *testing.T) {
	t.Parallel()
	a := MustOpenNode(t, testConfig(t.TempDir(), "a"))
	b := MustOpenNode(t, testConfig(t.TempDir(), "b"))
	if a.ClientURL() == b.ClientURL() || a.HTTPURL() == b.HTTPURL() {
		t.Fatalf("nodes share addresses: %s %s", a.ClientURL(), b.ClientURL())
	}
	if a.Identity().MeshID == b.Identity().MeshID {
		t.Fatal("two fresh nodes got the same mesh id")
	}
	for _, n := range []*runningNode{a, b} {
		if code, body := httpGet(t, n.HTTPURL()+"/readyz"); code != http.StatusOK {
			t.Fatalf("%s /readyz=%d %s", n.Identity().Name, code, body)
		}
	}
}

func TestNode_RestartKeepsIdentityAndStreams(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	n := MustOpenNode(t, cfg)
	first := n.Identity()
	nc := connect(t, n.ClientURL(), filepath.Join(cfg.DataDir, datadir.OperatorSeedFile))
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep.>"}}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := js.Publish(ctx, "keep.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	nc.Close()
	n.stop()

	n = MustOpenNode(t, cfg)
	if got := n.Identity(); got != first {
		t.Fatalf("identity after restart=%+v, want %+v", got, first)
	}
	nc = connect(t, n.ClientURL(), filepath.Join(cfg.DataDir, datadir.OperatorSeedFile))
	defer nc.Close()
	js, _ = jetstream.New(nc)
	s, err := js.Stream(ctx, "KEEP")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := info.State.Msgs, uint64(10); got != want {
		t.Fatalf("messages after restart=%d, want %d", got, want)
	}
}

func TestNode_Open(t *testing.T) {
	t.Parallel()
	t.Run("NameMismatch", func(t *testing.T) {
		dir := t.TempDir()
		MustOpenNode(t, testConfig(dir, "alpha")).stop()
		beta := testConfig(dir, "beta")
		beta.NameGiven = true
		err := node.New(beta, nil).Open()
		if !errors.Is(err, datadir.ErrNameMismatch) || !strings.Contains(err.Error(), "--name alpha") {
			t.Fatalf("err=%v, want datadir.ErrNameMismatch suggesting --name alpha", err)
		}
		// Not given (the host name's default): the data dir's name.
		n := MustOpenNode(t, testConfig(dir, "beta"))
		if n.Identity().Name != "alpha" {
			t.Fatalf("a node started without a name on alpha's data dir is %q", n.Identity().Name)
		}
		n.stop()
	})
	t.Run("NoIdentity", func(t *testing.T) {
		err := node.New(testConfig(t.TempDir(), "alpha"), nil).Open()
		if !errors.Is(err, datadir.ErrNoIdentity) {
			t.Fatalf("err=%v, want datadir.ErrNoIdentity", err)
		}
	})
	t.Run("CorruptStore", func(t *testing.T) {
		dir := t.TempDir()
		garbage := []byte(strings.Repeat("not a bbolt file ", 1000))
		if err := os.WriteFile(filepath.Join(dir, "meshnode.db"), garbage, 0o600); err != nil {
			t.Fatal(err)
		}
		n := node.New(testConfig(dir, "alpha"), nil)
		n.CreateIdentity = true
		err := n.Open()
		if !errors.Is(err, datadir.ErrCorruptStore) || !strings.Contains(err.Error(), "move it aside") {
			t.Fatalf("err=%v, want datadir.ErrCorruptStore saying what to do", err)
		}
	})
	t.Run("DataDirNotWritable", func(t *testing.T) {
		// Tests run as root, which ignores permission bits: a data dir beneath a regular file
		// cannot be created by anyone.
		file := filepath.Join(t.TempDir(), "file")
		os.WriteFile(file, nil, 0o600)
		n := node.New(testConfig(filepath.Join(file, "data"), "alpha"), nil)
		n.CreateIdentity = true
		err := n.Open()
		if err == nil || !strings.Contains(err.Error(), "--data-dir") {
			t.Fatalf("err=%v, want an error naming --data-dir", err)
		}
	})
	t.Run("DataDirInUse", func(t *testing.T) {
		cfg := testConfig(t.TempDir(), "alpha")
		MustOpenNode(t, cfg)
		n := node.New(cfg, nil)
		err := n.Open()
		if !errors.Is(err, datadir.ErrDataDirInUse) {
			t.Fatalf("err=%v, want datadir.ErrDataDirInUse", err)
		}
	})
	t.Run("ClientAddrInUse", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cfg := testConfig(t.TempDir(), "alpha")
		cfg.ClientAddr = l.Addr().String()
		cfg.HTTPAddr = testbed.FreeAddr(t)
		n := node.New(cfg, nil)
		n.CreateIdentity = true
		err = n.Open()
		if err == nil || !strings.Contains(err.Error(), l.Addr().String()) || !strings.Contains(err.Error(), "--client-addr") {
			t.Fatalf("err=%v, want it to name %s and --client-addr", err, l.Addr())
		}
		assertReleased(t, cfg, cfg.HTTPAddr)
	})
	t.Run("HTTPAddrInUse", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cfg := testConfig(t.TempDir(), "alpha")
		cfg.HTTPAddr = l.Addr().String()
		cfg.ClientAddr = testbed.FreeAddr(t)
		n := node.New(cfg, nil)
		n.CreateIdentity = true
		err = n.Open()
		if !errors.Is(err, node.ErrHTTPAddrInUse) || !strings.Contains(err.Error(), "--http-addr") {
			t.Fatalf("err=%v, want ErrHTTPAddrInUse naming --http-addr", err)
		}
		assertReleased(t, cfg, cfg.ClientAddr)
	})
}

// assertReleased proves a failed Open left nothing behind: the addresses the node had bound
// are free, there is no node.json, and the store can be opened again (its lock is released).
func assertReleased(t *testing.T, cfg config.Config, bound ...string) {
	t.Helper()
	for _, addr := range bound {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s still taken after a failed open: %v", addr, err)
		}
		l.Close()
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, datadir.InfoFile)); err == nil {
		t.Fatal("node.json left behind by a failed open")
	}
	cfg.ClientAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	n := node.New(cfg, nil)
	n.CreateIdentity = true
	if err := n.Open(); err != nil {
		t.Fatalf("reopen after failed open: %v", err)
	}
	n.Close()
}

func TestNode_Status_JSONKeys(t *testing.T) {
	t.Parallel()
	n := MustOpenNode(t, testConfig(t.TempDir(), "alpha"))
	_, body := httpGet(t, n.HTTPURL()+"/v1/status")
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "mesh_id", "version", "client_url", "jetstream", "ready"} {
		if _, ok := m[k]; !ok {
			t.Errorf("status lacks %q: %s", k, body)
		}
	}
}

// TestNode_RestartRefusesNoModule: a restarting node holds the connect of a key it has not
// read yet until it has read its registry, so a module that tries it all through the
// restart finds no server, then connects that time out, then its connection — never a
// refusal (after which most NATS clients give up for good). A plain nats.go client with its
// default options rides the restart out.
func TestNode_RestartRefusesNoModule(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.ClientAddr = testbed.FreeAddr(t)
	b := newBedAt(t, cfg)
	seed, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [x]\n")
	plain := b.raw(seed, "a")
	b.close()

	key, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var stopOnce sync.Once
	end := func() { stopOnce.Do(func() { close(stop) }) }
	t.Cleanup(end) // a failed start must not leave the probe going
	probed := make(chan error, 1)
	go func() {
		tries := 0
		for {
			tries++
			nc, err := nats.Connect("nats://"+cfg.ClientAddr, key, nats.MaxReconnects(0), nats.Timeout(time.Second))
			if err == nil {
				nc.Close()
				probed <- nil
				return
			}
			if errors.Is(err, nats.ErrAuthorization) {
				probed <- fmt.Errorf("try %d: %w", tries, err)
				return
			}
			select {
			case <-stop:
				probed <- fmt.Errorf("no connection in %d tries, the last: %w", tries, err)
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	MustOpenNode(t, cfg)
	select {
	case err := <-probed:
		if err != nil {
			t.Fatalf("a module trying the restarting node: %v", err)
		}
	case <-time.After(10 * time.Second):
		end()
		t.Fatalf("the restarted node: %v", <-probed)
	}
	retryUntil(t, 30*time.Second, func() error {
		if !plain.IsConnected() {
			return fmt.Errorf("the plain client is %v (last error %v)", plain.Status(), plain.LastError())
		}
		return nil
	})
	if err := plain.Publish("mesh.admit.a.mesh.mod.a.event.x", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := plain.Flush(); err != nil || plain.LastError() != nil {
		t.Fatalf("publish after the restart: %v %v", err, plain.LastError())
	}
}
