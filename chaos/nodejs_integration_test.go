//go:build integration

package chaos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestIntegration_JSModule: the Node.js module, run by StartJSModule against one real node
// whose client port is TLS (so it must trust the mesh's CA it is given), consumes an event
// a Go module emits and answers it with its own; the History holds its delivery of the one
// and its acked emit of the other, under the id the Go reader receives.
func TestIntegration_JSModule(t *testing.T) {
	dir := t.TempDir()
	url := startJSBedNode(t, dir).url
	ca := filepath.Join(dir, meshca.CAFile)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	seeds := registerJSBed(t, ctx, url, filepath.Join(dir, datadir.OperatorSeedFile), ca, dir)
	h := NewHistory()
	js, err := StartJSModule(t, url, seeds["notes"], ca, "notes", h)
	if err != nil {
		t.Fatal(err)
	}
	notes := make(chan sdk.Event, 4)
	reader, err := sdk.Connect(ctx, url, seeds["reader"], sdk.RootCA(ca))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if err := reader.On("notes.note.written", func(_ context.Context, e sdk.Event) error { notes <- e; return nil }); err != nil {
		t.Fatal(err)
	}
	shop, err := sdk.Connect(ctx, url, seeds["shop"], sdk.RootCA(ca))
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	orderID, err := shop.Emit(ctx, "order.placed", map[string]any{"order": 1})
	if err != nil {
		t.Fatal(err)
	}
	var note sdk.Event
	select {
	case note = <-notes:
	case <-ctx.Done():
		t.Fatalf("no note from the Node.js module; its output:\n%s", js.Log())
	}

	// Its delivery line comes after its emit was acked (it acks the order last): wait for it.
	testbed.RetryUntil(t, 20*time.Second, func() error {
		if deliveries(h, "notes", orderID) == 0 {
			return fmt.Errorf("no delivery of %s to notes in the history: %v", orderID, h.Ops())
		}
		return nil
	})
	js.Stop()
	var emits []Op
	for _, o := range h.Ops() {
		if o.Kind == "emit" {
			emits = append(emits, o)
		}
	}
	if len(emits) != 1 || emits[0].Process != "notes" || emits[0].Key != note.ID || emits[0].Value != "note.written" || !emits[0].OK {
		t.Errorf("the history's emits %v, want notes' acked note.written %s", emits, note.ID)
	}
	if n := deliveries(h, "notes", orderID); n != 1 {
		t.Errorf("notes delivered %s %d times in the history, want once: %v", orderID, n, h.Ops())
	}
	if !strings.Contains(js.Log(), "ready notes") {
		t.Errorf("the module's log lacks its ready line:\n%s", js.Log())
	}
	if t.Failed() {
		t.Logf("the module's output:\n%s", js.Log())
	}
}

// registerJSBed registers the bed's modules through the operator (its seed in operatorSeed)
// — shop emits orders, notes (the Node.js module) consumes them and emits notes, reader
// consumes notes — and returns their seed files, written into dir, by module.
func registerJSBed(t *testing.T, ctx context.Context, url, operatorSeed, ca, dir string) map[string]string {
	t.Helper()
	op, err := nats.Connect(url, nkeyFrom(t, operatorSeed),
		nats.CustomInboxPrefix(manifest.OperatorInbox), sdk.TrustCA(ca))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	seeds := map[string]string{}
	for _, text := range []string{
		"module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n",
		"module: notes\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\nemits: [note.written]\n",
		"module: reader\nrequires: [mesh-bus]\nconsumes: [notes.note.written]\n",
	} {
		reg, err := admin.Register(ctx, op, []byte(text))
		if err != nil {
			t.Fatalf("register %q: %v", text, err)
		}
		seeds[reg.Module] = filepath.Join(dir, reg.Module+".nk")
		if err := os.WriteFile(seeds[reg.Module], reg.Seed, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return seeds
}

// TestIntegration_JSModule_SurvivesRestartAndDrift: the Node.js module goes on handling events
// through what the Go sdk survives — its node killed (kill -9) and restarted, so its
// connection drops and comes back and the pull it was waiting on is gone; and its durable
// consumer deleted under it (drift repair makes it again), which ends its consumption. An
// event emitted after each is handled.
func TestIntegration_JSModule_SurvivesRestartAndDrift(t *testing.T) {
	b := newOneNodeJSBed(t)
	node, ctx, h, js, shop := b.node, b.ctx, b.h, b.js, b.shop
	handled := func(after string) { t.Helper(); handledAfter(t, ctx, h, js, shop, after) }
	handled("it started")

	node.kill()
	node.start(t)
	handled("its node was killed and restarted")

	ops := b.operator(t)
	if err := ops.DeleteConsumer(ctx, manifest.EventsStreamName, "notes"); err != nil {
		t.Fatal(err)
	}
	handled("its consumer was deleted")
}

// TestIntegration_JSModule_SurvivesRepeatedDrift: the 30-minute chaos run (seed 7) deleted
// the Node.js module's consumer three times within 15 s while ticks were emitted about 13 a
// second; the module never handled an event emitted after that (5,310 in the remaining ten
// minutes) and went on handling the older ones slowly. Here on one node: steady emits, the
// consumer deleted three times about 4 s apart (each time made again by the drift check),
// then an event emitted after is handled. It passes: on one node, without the run's other
// faults, the stall does not come back (docs/chaos.md).
func TestIntegration_JSModule_SurvivesRepeatedDrift(t *testing.T) {
	b := newOneNodeJSBed(t)
	ctx, h, js, shop := b.ctx, b.h, b.js, b.shop
	handledAfter(t, ctx, h, js, shop, "it started")
	ops := b.operator(t)
	// The chaos run's pace: a tick every 75 ms, through the deletions.
	emitting, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(75 * time.Millisecond)
		defer tick.Stop()
		for emitting.Err() == nil {
			select {
			case <-emitting.Done():
			case <-tick.C:
				ectx, cancel := context.WithTimeout(emitting, 5*time.Second)
				shop.Emit(ectx, "order.placed", map[string]any{"when": "steady"})
				cancel()
			}
		}
	}()
	defer func() { stop(); <-done }()
	for i := range 3 {
		testbed.RetryUntil(t, 30*time.Second, func() error {
			_, err := ops.Consumer(ctx, manifest.EventsStreamName, "notes")
			return err // made again by the drift check
		})
		if err := ops.DeleteConsumer(ctx, manifest.EventsStreamName, "notes"); err != nil {
			t.Fatalf("delete the consumer (%d): %v", i+1, err)
		}
		time.Sleep(4 * time.Second) // the chaos run's spacing of the deletions, not a wait for a state
	}
	handledAfter(t, ctx, h, js, shop, "its consumer was deleted three times under load")
}

// TestIntegration_JSModule_InACluster: in a three-node mesh, the Node.js module, connected to
// a node that does not lead its consumer, goes on handling events through what the chaos run
// does around it: its consumer's leader killed (the pull it waits on was the leader's, and
// the consumer elects another: the module of the chaos run seed 38 never consumed again
// after that), its own node killed and restarted, and its node cut off the network while
// events are emitted, then healed. An event emitted after each is handled.
func TestIntegration_JSModule_InACluster(t *testing.T) {
	c := StartCluster(t, Options{Servers: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	seeds := registerJSBed(t, ctx, c.Nodes[0].ClientURL(), c.OperatorSeed(), c.CA(), t.TempDir())
	op, err := c.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	ops, err := jetstream.New(op)
	if err != nil {
		t.Fatal(err)
	}
	var leader int
	testbed.RetryUntil(t, 30*time.Second, func() (err error) {
		leader, err = consumerLeader(ctx, c, ops, "notes")
		return err
	})
	// The module on a node that does not lead its consumer; shop emits through the third.
	home, away := (leader+1)%3, (leader+2)%3
	h := NewHistory()
	js, err := StartJSModule(t, c.Nodes[home].ClientURL(), seeds["notes"], c.CA(), "notes", h)
	if err != nil {
		t.Fatal(err)
	}
	shop, err := sdk.Connect(ctx, c.Nodes[away].ClientURL(), seeds["shop"], sdk.RootCA(c.CA()))
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	handled := func(after string) { t.Helper(); handledAfter(t, ctx, h, js, shop, after) }
	handled("it started")

	if err := c.Nodes[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	handled(fmt.Sprintf("its consumer's leader %s was killed", c.Nodes[leader].Name()))
	restart(t, c.Nodes[leader])

	if err := c.Nodes[home].Kill(); err != nil {
		t.Fatal(err)
	}
	restart(t, c.Nodes[home])
	handled("its node was killed and restarted")

	if err := c.Isolate(home); err != nil {
		t.Fatal(err)
	}
	id := emitOrder(t, ctx, shop, "while its node was cut off")
	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	// The module's bound starts when the mesh is whole again: after a cut, JetStream itself
	// needs its routes back and a meta leader before any consumer answers (CI saw 30 s), and
	// no client, the Go sdk included, consumes before that.
	healed := time.Now()
	testbed.RetryUntil(t, 2*time.Minute, c.Settled)
	t.Logf("the mesh settled %s after the heal", time.Since(healed).Round(time.Millisecond))
	// Sent while the module's node was cut off, the event may have gone to the module's
	// waiting pull and been lost in the cut: JetStream counts it delivered and sends it again
	// when its ack wait ends (the first back-off step, 30 s; docs/contracts.md), for any
	// client. With a bound of 20 s here, the bed failed in two loaded local CI runs and passed
	// alone; this would do it (the failures' logs were not kept).
	waitHandledWithin(t, h, js, id, "its node was cut off, then healed", manifest.BackOff1+jsRecoverWithin)
	handled("its node was healed")
}

// oneNodeJSBed is one meshnode process with the Node.js module "notes" on it and the sdk
// module "shop" connected, for the beds that emit through shop and wait for notes.
type oneNodeJSBed struct {
	node    *jsBedNode
	dir, ca string
	ctx     context.Context // ends with the test, 4 minutes at most
	h       *History
	js      *JSModule
	shop    *sdk.Client
}

func newOneNodeJSBed(t *testing.T) *oneNodeJSBed {
	t.Helper()
	dir := t.TempDir()
	b := &oneNodeJSBed{node: startJSBedNode(t, dir), dir: dir, ca: filepath.Join(dir, meshca.CAFile), h: NewHistory()}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	b.ctx = ctx
	seeds := registerJSBed(t, ctx, b.node.url, filepath.Join(dir, datadir.OperatorSeedFile), b.ca, dir)
	var err error
	if b.js, err = StartJSModule(t, b.node.url, seeds["notes"], b.ca, "notes", b.h); err != nil {
		t.Fatal(err)
	}
	if b.shop, err = sdk.Connect(ctx, b.node.url, seeds["shop"], sdk.RootCA(b.ca)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.shop.Close() })
	return b
}

// operator is the operator's JetStream on the bed's node, closed when the test ends.
func (b *oneNodeJSBed) operator(t *testing.T) jetstream.JetStream {
	t.Helper()
	op, err := nats.Connect(b.node.url, nkeyFrom(t, filepath.Join(b.dir, datadir.OperatorSeedFile)),
		nats.CustomInboxPrefix(manifest.OperatorInbox), sdk.TrustCA(b.ca))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Close)
	ops, err := jetstream.New(op)
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

// restart starts a killed node again and waits until it is ready.
func restart(t *testing.T, n *Node) {
	t.Helper()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.AwaitReady(90 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// consumerLeader is the index of the node leading module's consumer on EVENTS.
func consumerLeader(ctx context.Context, c *Cluster, js jetstream.JetStream, module string) (int, error) {
	cons, err := js.Consumer(ctx, manifest.EventsStreamName, module)
	if err != nil {
		return 0, err
	}
	info := cons.CachedInfo()
	for i, n := range c.Nodes {
		if info.Cluster != nil && n.Name() == info.Cluster.Leader {
			return i, nil
		}
	}
	return 0, fmt.Errorf("consumer %s has no leader among the nodes yet: %+v", module, info.Cluster)
}

// handledAfter emits an order through shop and waits until the Node.js module handled it.
func handledAfter(t *testing.T, ctx context.Context, h *History, js *JSModule, shop *sdk.Client, after string) {
	t.Helper()
	waitHandledWithin(t, h, js, emitOrder(t, ctx, shop, "after "+after), after, jsRecoverWithin)
}

// emitOrder emits an order through shop, again while the mesh is still settling, and returns
// its id.
func emitOrder(t *testing.T, ctx context.Context, shop *sdk.Client, when string) string {
	t.Helper()
	var id string
	testbed.RetryUntil(t, 60*time.Second, func() (err error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		id, err = shop.Emit(ctx, "order.placed", map[string]any{"when": when})
		return err
	})
	t.Logf("emitted order %s %s", id, when)
	return id
}

// waitHandledWithin waits until the Node.js module handled event id, emitted after what
// after says, for at most bound.
func waitHandledWithin(t *testing.T, h *History, js *JSModule, id, after string, bound time.Duration) {
	t.Helper()
	testbed.RetryUntil(t, bound, func() error {
		if deliveries(h, "notes", id) == 0 {
			return fmt.Errorf("the Node.js module did not handle %s, emitted after %s; its output:\n%s", id, after, js.Log())
		}
		return nil
	})
}

// jsRecoverWithin bounds how long the Node.js module may take to handle an event after a
// fault: the Go sdk consumes again within seconds; a client library left to notice by
// itself (missed heartbeats, its 30 s pull expiring) takes longer.
const jsRecoverWithin = 20 * time.Second

// deliveries counts the completed deliveries of event id to module in h.
func deliveries(h *History, module, id string) int {
	n := 0
	for _, o := range h.Ops() {
		if o.Kind == "deliver" && o.Process == module && o.Key == id && o.OK && o.Value == manifest.EventSubject("shop", "order.placed") {
			n++
		}
	}
	return n
}

// jsBedReadyRE is a node's ready line, which names its client URL.
var jsBedReadyRE = regexp.MustCompile(`^meshnode ready: node \S+, mesh \S+, client (\S+), http \S+$`)

// jsBedNode is the one meshnode process a Node.js module bed runs: on loopback with a TLS
// client port (client-tls always: what every node off loopback has) on a port fixed across
// its restarts, so a module reconnects to the same URL.
type jsBedNode struct {
	bin, dir, clientAddr string
	url                  string // its client URL, once it said it is ready
	cmd                  *exec.Cmd
	exited               chan struct{}
}

// startJSBedNode runs one node (the binary the Cluster builds) in dir until the test ends;
// it returns once the node is ready.
func startJSBedNode(t *testing.T, dir string) *jsBedNode {
	t.Helper()
	bin, err := meshnodeBinary()
	if err != nil {
		t.Fatal(err)
	}
	n := &jsBedNode{bin: bin, dir: dir, clientAddr: testbed.FreeAddr(t)}
	n.start(t)
	t.Cleanup(n.kill)
	return n
}

// start runs the node (again, on its data dir) and returns once it is ready.
func (n *jsBedNode) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(n.bin, "up", "--data-dir", n.dir, "--name", "alpha",
		"--client-addr", n.clientAddr, "--http-addr", "127.0.0.1:0", "--client-tls", "always")
	cmd.Env = moduleEnv() // none of the test's settings (CI sets MESHNODE_BEDS) may reach the node
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &testbed.SyncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := jsBedReadyRE.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		cmd.Wait()
		close(exited)
	}()
	n.cmd, n.exited = cmd, exited
	select {
	case n.url = <-urls:
	case <-exited:
		t.Fatalf("meshnode up exited before ready: %s\n%s", cmd.ProcessState, stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("meshnode up not ready after 60s\n%s", stderr)
	}
}

// kill ends the node with SIGKILL, as a crash would, and returns once it has exited.
func (n *jsBedNode) kill() {
	n.cmd.Process.Kill()
	<-n.exited
}

// nkeyFrom is the nats option authenticating with the seed in file.
func nkeyFrom(t *testing.T, file string) nats.Option {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(file)
	if err != nil {
		t.Fatal(err)
	}
	return opt
}
