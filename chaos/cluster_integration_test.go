//go:build integration

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats.go/jetstream"
)

// TestIntegration_ChaosCluster: three meshnode processes, each in its own network
// namespace, found a mesh and two more grow it to five; then every kind of fault the
// nemesis knows is injected once through the Cluster's own methods. With two servers
// killed the other three still register a module; a pause and a partition are seen by the
// mesh (the copies there behind), a partition in the namespaces too (no connection across
// it). After each fault every node's /readyz answers 200, the mesh keeps every
// stream's copies current again (Settled) and a registration through a node goes through;
// a deleted consumer and a deleted seat queue come back. Last, a nemesis injects one fault
// of its schedule and heals it.
func TestIntegration_ChaosCluster(t *testing.T) {
	c := StartCluster(t, Options{Servers: 3, Spare: 2})
	c.Grow(t, 2)
	if got := c.Members(); len(got) != 5 {
		t.Fatalf("members after the grow: %v, want 5", got)
	}
	if r := c.Meshnode(t, "members", "--json"); r.Code != 0 || strings.Count(r.Stdout, `"state":"alive"`) != 5 {
		t.Fatalf("members: exit %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	httpsBeyondLoopback(t, c)
	registered := 0
	// register registers a fresh module through node i: the controller (a seat) and the
	// registry's quorum answered.
	register := func(i int, text string) error {
		registered++
		path := filepath.Join(t.TempDir(), "m.yaml")
		if text == "" {
			text = fmt.Sprintf("module: probe%d\nrequires: [mesh-bus]\nemits: [ping]\n", registered)
		}
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		r := c.Nodes[i].Meshnode(t, "module", "register", path, "--creds-out", filepath.Join(t.TempDir(), "m.nk"))
		if r.Code != 0 {
			return fmt.Errorf("register through node %s: exit %d %s", c.Nodes[i].Name(), r.Code, r.Stderr)
		}
		return nil
	}
	// healthy waits until every member is ready and a registration through node i goes
	// through. A restarted node has sometimes taken about 2 minutes to start its bus (not yet
	// explained, docs/chaos.md): the wait allows for it, and the time taken is logged.
	healthy := func(after string, i int) {
		t.Helper()
		start := time.Now()
		testbed.RetryUntil(t, 4*time.Minute, func() error {
			if err := c.Settled(); err != nil {
				return fmt.Errorf("after %s: %w", after, err)
			}
			return register(i, "")
		})
		t.Logf("after %s the mesh was ready again in %s", after, time.Since(start).Round(time.Millisecond))
	}
	// survives waits until the nodes still up take a registration through node i.
	survives := func(during string, i int) {
		t.Helper()
		testbed.RetryUntil(t, 60*time.Second, func() error {
			if err := register(i, ""); err != nil {
				return fmt.Errorf("during %s: %w\n%s", during, err, replication(t, c, i))
			}
			return nil
		})
	}
	down := func(i int) {
		t.Helper()
		if err := c.Ready(i); err == nil {
			t.Fatalf("node %s still answers /readyz 200", c.Nodes[i].Name())
		}
	}
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// The grown mesh moves its streams' replicas onto the new servers for a while: a
	// registration may be refused until they settle.
	healthy("the grow", 4)
	// Drift's targets: a durable consumer of EVENTS and a seat's queue.
	check(register(0, "module: shop\nrequires: [mesh-bus]\nemits: [sold]\n"))
	check(register(0, "module: ledger\nrequires: [mesh-bus]\nconsumes: [shop.sold]\n"))
	check(register(0, "module: mailer\nrequires: [mesh-bus]\nseats:\n  mail: {scope: mesh, retain: 1h, accepts: [send]}\n"))

	// kill: the controller's holder.
	h, err := c.Holder("mesh-controller")
	check(err)
	check(c.Nodes[h].Kill())
	if c.Nodes[h].Running() {
		t.Fatalf("node %s runs after Kill", c.Nodes[h].Name())
	}
	down(h)
	check(c.Nodes[h].Start())
	healthy(KindKill, h)

	// kill-two: three of five go on.
	check(c.Nodes[2].Kill())
	check(c.Nodes[3].Kill())
	survives(KindKillTwo, 0)
	check(c.Nodes[2].Start())
	check(c.Nodes[3].Start())
	healthy(KindKillTwo, 2)

	// pause, longer than a lease lives.
	check(c.Nodes[4].Pause())
	if !c.Nodes[4].Paused() || !c.Nodes[4].Running() {
		t.Fatal("node e is not paused and running after Pause")
	}
	down(4)
	behind(t, c, 0, "e")
	time.Sleep(2 * seats.DefaultTTL) // the pause itself: how long the fault lasts, not a wait for a state
	check(c.Nodes[4].Resume())
	healthy(KindPause, 4)

	// partition-majority: the majority sees the minority's copies fall behind.
	check(c.Partition([]int{0, 1}, []int{2, 3, 4}))
	cut(t, c, [][2]int{{0, 2}, {1, 3}, {4, 0}}, [][2]int{{0, 1}, {2, 3}, {4, 2}})
	behind(t, c, 3, "a", "b")
	check(c.Heal())
	healthy(KindPartitionMajority, 0)

	// isolate: no node and no client reaches it.
	check(c.Isolate(0))
	down(0)
	cut(t, c, [][2]int{{1, 0}, {4, 0}}, [][2]int{{1, 2}})
	behind(t, c, 2, "a")
	check(c.Heal())
	healthy(KindIsolate, 0)

	// bridge: c sees both sides, which do not see each other.
	check(c.Partition([]int{0, 1}, []int{3, 4}))
	cut(t, c, [][2]int{{0, 3}, {1, 4}, {4, 0}}, [][2]int{{2, 0}, {2, 4}, {0, 2}, {3, 2}, {0, 1}})
	check(c.Heal())
	healthy(KindBridge, 1)

	// kill-during-partition: e cut off, then b killed.
	check(c.Partition([]int{4}, []int{0, 1, 2, 3}))
	check(c.Nodes[1].Kill())
	down(1)
	cut(t, c, [][2]int{{4, 0}, {2, 4}}, [][2]int{{0, 2}})
	check(c.Nodes[1].Start())
	check(c.Heal())
	healthy(KindKillDuringPartition, 4)

	// drift-consumer and drift-stream: deleted through the operator's connection, and made
	// again by the mesh's drift repair.
	nc, err := c.Connect()
	check(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	check(err)
	// Each call is bounded: a request the JetStream API does not answer is tried again.
	call := func(f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return f(ctx)
	}
	consumer := func(ctx context.Context) error {
		_, err := js.Consumer(ctx, manifest.EventsStreamName, "ledger")
		return err
	}
	seat := manifest.SeatStreamName("mail")
	stream := func(ctx context.Context) error {
		_, err := js.Stream(ctx, seat)
		return err
	}
	testbed.RetryUntil(t, 30*time.Second, func() error {
		if err := call(consumer); err != nil {
			return fmt.Errorf("ledger's consumer of EVENTS: %w", err)
		}
		return call(stream)
	})
	check(call(func(ctx context.Context) error { return js.DeleteConsumer(ctx, manifest.EventsStreamName, "ledger") }))
	testbed.RetryUntil(t, 60*time.Second, func() error { return call(consumer) })
	healthy(KindDriftConsumer, 2)
	check(call(func(ctx context.Context) error { return js.DeleteStream(ctx, seat) }))
	testbed.RetryUntil(t, 60*time.Second, func() error { return call(stream) })
	healthy(KindDriftStream, 3)

	// disk-full: d's data dir refuses writes until freed.
	check(c.FillDisk(3))
	if err := os.WriteFile(filepath.Join(c.Nodes[3].DataDir(), "probe"), []byte("x"), 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a write to the filled data dir: %v, want ENOSPC", err)
	}
	check(c.FreeDisk(3))
	// nats-server disables JetStream for good on a write error: the node is restarted once
	// its disk has room (as the nemesis does).
	check(c.Nodes[3].Kill())
	check(c.Nodes[3].Start())
	healthy(KindDiskFull, 3)

	// The nemesis: a run shorter than one fault injects the seed's first (seed 7 draws a
	// bridge), heals it and leaves the mesh settled.
	nm := NewNemesis(c, 7)
	nm.Logf = t.Logf
	check(nm.Run(context.Background(), time.Second))
	if f := nm.Faults(); len(f) != 1 || f[0].Kind != KindBridge || len(f[0].Groups) != 2 || nm.Counts()[KindBridge] != 1 {
		t.Fatalf("the nemesis injected %v, counts %v; want one bridge", f, nm.Counts())
	}
	check(c.Settled())
}

// cut waits until every pair of apart cannot open a connection from the first node's
// namespace to the second's cluster port, and checks that every pair of together can.
func cut(t *testing.T, c *Cluster, apart, together [][2]int) {
	t.Helper()
	testbed.RetryUntil(t, 10*time.Second, func() error {
		for _, p := range apart {
			if reaches(c, p[0], p[1]) {
				return fmt.Errorf("node %s still reaches node %s", c.Nodes[p[0]].Name(), c.Nodes[p[1]].Name())
			}
		}
		return nil
	})
	for _, p := range together {
		if !reaches(c, p[0], p[1]) {
			t.Fatalf("node %s does not reach node %s", c.Nodes[p[0]].Name(), c.Nodes[p[1]].Name())
		}
	}
}

// reaches reports whether a TCP connection from node from's namespace to node to's
// cluster port opens.
func reaches(c *Cluster, from, to int) bool {
	dev := fmt.Sprintf("/dev/tcp/%s/%d", c.lan.addr(to), clusterPort)
	return c.lan.command(from, "timeout", "2", "bash", "-c", "exec 3<>"+dev).Run() == nil
}

// behind waits until node i reports the copies of every stream on the named nodes behind:
// the mesh saw the cut.
func behind(t *testing.T, c *Cluster, i int, names ...string) {
	t.Helper()
	testbed.RetryUntil(t, 30*time.Second, func() error {
		r := c.Nodes[i].Meshnode(t, "status", "--json")
		var st api.NodeStatus
		if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil || st.Replication == nil {
			return fmt.Errorf("status on %s: exit %d %s %s", c.Nodes[i].Name(), r.Code, r.Stdout, r.Stderr)
		}
		for _, s := range st.Replication.Streams {
			for _, name := range names {
				if !slices.Contains(s.Behind, name) {
					return fmt.Errorf("node %s reports stream %s's copy on %s current (behind: %v)", c.Nodes[i].Name(), s.Name, name, s.Behind)
				}
			}
		}
		return nil
	})
}

// replication is what node i says of the streams that are not fully current, for a
// failure's message.
func replication(t *testing.T, c *Cluster, i int) string {
	r := c.Nodes[i].Meshnode(t, "status", "--json")
	var st api.NodeStatus
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil || st.Replication == nil {
		return fmt.Sprintf("status on %s: exit %d %s", c.Nodes[i].Name(), r.Code, r.Stderr)
	}
	var out []string
	for _, s := range st.Replication.Streams {
		if !s.Quorum || s.Current < s.Replicas {
			out = append(out, fmt.Sprintf("%s: %d of %d current, leader %q, behind %v, quorum %v %s", s.Name, s.Current, s.Replicas, s.Leader, s.Behind, s.Quorum, s.Why))
		}
	}
	return fmt.Sprintf("node %s (meta leader %q) sees:\n%s", c.Nodes[i].Name(), st.JetStream.MetaLeader, strings.Join(out, "\n"))
}

// httpsBeyondLoopback: a node whose HTTP address is beyond loopback serves it over TLS with
// its certificate from the mesh's CA: a client trusting the CA is answered (the CLI's
// status, members and ui included, which trust the data dir's ca.pem), one that does not is
// refused, and nothing answers in plain HTTP.
func httpsBeyondLoopback(t *testing.T, c *Cluster) {
	t.Helper()
	n := c.Nodes[0]
	base := n.HTTPURL()
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("node %s's HTTP address %s: want https beyond loopback", n.Name(), base)
	}
	resp, err := c.HTTPClient(5 * time.Second).Get(base + "/v1/status")
	if err != nil {
		t.Fatalf("GET /v1/status trusting the mesh's CA: %v", err)
	}
	resp.Body.Close()
	untrusting := &http.Client{Timeout: 5 * time.Second}
	if _, err := untrusting.Get(base + "/v1/status"); err == nil {
		t.Errorf("GET /v1/status without the mesh's CA was answered, want the certificate refused")
	}
	plain := "http://" + strings.TrimPrefix(base, "https://")
	if resp, err := untrusting.Get(plain + "/v1/status"); err == nil {
		code := resp.StatusCode
		resp.Body.Close()
		if code == http.StatusOK {
			t.Errorf("GET %s/v1/status in plain HTTP: %d, want no answer in the clear", plain, code)
		}
	}
	if r := n.Meshnode(t, "status", "--json"); r.Code != 0 || !strings.Contains(r.Stdout, `"http_url": "https://`) {
		t.Errorf("status over HTTPS: exit %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	if r := n.Meshnode(t, "ui"); r.Code != 0 || !strings.HasPrefix(r.Stdout, base+"/ui/login?") {
		t.Errorf("ui over HTTPS: exit %d %q %s, want a link to %s", r.Code, r.Stdout, r.Stderr, base)
	}
}
