//go:build integration

package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
)

// The multi-process cluster beds: three meshnode processes each, killed, signalled, stopped
// and partitioned. They run in CI's integration step (go test -tags integration -run
// '^TestIntegration'), not in the fast tier.

// TestIntegration_FoundThree: genesis --expect 3 and two `join --token` processes form one mesh;
// every node reports the same mesh and is ready; a fourth node joins later with a join token.
func TestIntegration_FoundThree(t *testing.T) {
	nodes, _, token := formThree(t)
	// Neither founding node that joined shows the token in ps, nor was warned about it.
	for _, n := range nodes[1:] {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n.p.cmd.Process.Pid))
		if err != nil || len(cmdline) == 0 || strings.Contains(string(cmdline), token) || strings.Contains(string(cmdline), "MNF1.") {
			t.Fatalf("node %s's command line %q (%v) shows the token", n.name, cmdline, err)
		}
		if strings.Contains(n.p.stderr.String(), "visible to every user") {
			t.Fatalf("node %s was warned about a token it did not get on its command line", n.name)
		}
	}
	r := meshnode(t, nil, "status", "--json", "--data-dir", nodes[1].dir)
	if r.code != 0 || !strings.Contains(r.stdout, `"ready": true`) {
		t.Fatalf("status of a founding node: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = meshnode(t, nil, "members", "--json", "--data-dir", nodes[1].dir)
	if r.code != 0 || strings.Count(r.stdout, `"state":"alive"`) != 3 || strings.Count(r.stdout, `"jetstream":"leader"`) != 1 {
		t.Fatalf("members: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	// In a mesh as on one node, a member's address is where its modules and CLI connect (its
	// client URL); gossip's address is gossip_addr.
	for line := range strings.Lines(r.stdout) {
		var m struct {
			Name, Address string
			Gossip        string `json:"gossip_addr"`
		}
		json.Unmarshal([]byte(line), &m)
		for _, n := range nodes {
			if n.name == m.Name && (m.Address != n.p.clientURL || m.Gossip != flagValue(n.flags, "--gossip-addr")) {
				t.Errorf("members lists %s at %q, gossip %q: want its client URL %s and gossip address %s", m.Name, m.Address, m.Gossip, n.p.clientURL, flagValue(n.flags, "--gossip-addr"))
			}
		}
	}
	// join kept c's addresses beside its data dir: restarted as the unit starts it (the data
	// dir alone), it comes back into the mesh.
	c := nodes[2]
	if code, _ := c.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("stop c: exit %d", code)
	}
	c.p = startNode(t, "run", "--data-dir", c.dir, "--log-level", logLevelForTests())
	retryUntil(t, 30*time.Second, func() error {
		r := meshnode(t, nil, "members", "--json", "--data-dir", nodes[0].dir)
		if strings.Count(r.stdout, `"state":"alive"`) != 3 {
			return fmt.Errorf("members after c's restart with its data dir alone: %s %s", r.stdout, r.stderr)
		}
		return nil
	})
	// The founding token is spent once the mesh has formed.
	if r := meshnode(t, nil, append([]string{"join", "--token", token}, newMeshNode(t, "late").flags...)...); r.code != 1 || !strings.Contains(r.stderr, "founding token is spent") {
		t.Fatalf("a fourth node with the founding token: exit %d %s", r.code, r.stderr)
	}

	// Refusals, each saying what is wrong.
	if r := meshnode(t, nil, "genesis", "--expect", "3", "--data-dir", nodes[0].dir, "--name", "a"); r.code != 1 || !strings.Contains(r.stderr, "in use") {
		t.Fatalf("genesis on a running node's data dir: exit %d %s", r.code, r.stderr)
	}
	// A founding token whose gossip key is not the mesh's.
	ft, err := genesis.ParseFounding(token)
	if err != nil {
		t.Fatal(err)
	}
	ft.GossipKey = make([]byte, 32)
	if r := meshnode(t, nil, append([]string{"join", "--token", foundingToken(ft)}, newMeshNode(t, "k").flags...)...); r.code != 1 || !strings.Contains(r.stderr, "gossip key does not match") {
		t.Fatalf("a node with the wrong gossip key: exit %d %s", r.code, r.stderr)
	}
	// A second genesis whose founding node is pointed at this running mesh.
	y := newMeshNode(t, "y")
	r = meshnode(t, nil, append([]string{"genesis", "--expect", "3", "--json"}, y.flags...)...)
	var yg struct {
		FoundingToken string `json:"founding_token"`
	}
	if json.Unmarshal([]byte(r.stdout), &yg); r.code != 0 {
		t.Fatalf("second genesis: exit %d %s", r.code, r.stderr)
	}
	yt, _ := genesis.ParseFounding(yg.FoundingToken)
	yt.Gossip = []string{nodes[0].flags[slices.Index(nodes[0].flags, "--gossip-addr")+1]}
	if r := meshnode(t, nil, append([]string{"join", "--token", foundingToken(yt)}, newMeshNode(t, "z").flags...)...); r.code != 1 || !strings.Contains(r.stderr, "another mesh") {
		t.Fatalf("a node of a second genesis against the running mesh: exit %d %s", r.code, r.stderr)
	}

	// A fourth node joins the formed mesh with a join token and serves clients.
	r = meshnode(t, nil, "token", "create", "--json", "--data-dir", nodes[0].dir)
	var jt struct{ Token string }
	if json.Unmarshal([]byte(r.stdout), &jt); r.code != 0 || !strings.HasPrefix(jt.Token, "MNJ1.") {
		t.Fatalf("token create: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	d := newMeshNode(t, "d")
	start := time.Now()
	d.p = startNode(t, "join", append([]string{"--token", jt.Token}, d.flags...)...)
	t.Logf("a fourth node joined and was ready in %s", time.Since(start))
	// Later starts of a joined node are plain `run`.
	if code, _ := d.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("stop the joined node: exit %d\n%s", code, d.p.stderr)
	}
	d.p = startNode(t, "run", d.flags...)
	retryUntil(t, 30*time.Second, func() error {
		r := meshnode(t, nil, "members", "--json", "--data-dir", d.dir)
		if r.code != 0 || strings.Count(r.stdout, `"state":"alive"`) != 4 || !strings.Contains(r.stdout, `"name":"d"`) {
			return fmt.Errorf("members from d: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		return nil
	})
	seed := registerModule(t, d.dir, "module: joined\nrequires: [mesh-bus]\nemits: [hello]\n", "--creds", nodes[0].dir+"/operator.nk")
	retryUntil(t, 20*time.Second, func() error {
		if r := meshnode(t, nil, "emit", "hello", `{"n":1}`, "--data-dir", d.dir, "--creds", seed); r.code != 0 {
			return fmt.Errorf("emit through the joined node: exit %d %s", r.code, r.stderr)
		}
		return nil
	})
	// A join token of another mesh, pointed at this one, is refused at the door.
	dToken := jt.Token
	otherDir := t.TempDir()
	startNode(t, "up", upArgs(otherDir, "o")...)
	r = meshnode(t, nil, "token", "create", "--json", "--data-dir", otherDir)
	var ot struct{ Token string }
	if json.Unmarshal([]byte(r.stdout), &ot); r.code != 0 {
		t.Fatalf("token create on another mesh: exit %d %s", r.code, r.stderr)
	}
	fb, err := vault.ParseToken(ot.Token)
	if err != nil {
		t.Fatal(err)
	}
	fb.Addrs = []string{d.p.clientURL}
	fb.Expect = 3 // as if that mesh had three servers: the joining node would refuse a single node's token itself
	if r := meshnode(t, nil, append([]string{"join", "--token", fb.String()}, newMeshNode(t, "f").flags...)...); r.code != 1 || !strings.Contains(r.stderr, "not a token of the mesh there") {
		t.Fatalf("a join token of another mesh: exit %d %s", r.code, r.stderr)
	}

	// The token was for one node; a second use and a taken name are refused, each saying so.
	if r := meshnode(t, nil, append([]string{"join", "--token", dToken}, newMeshNode(t, "e").flags...)...); r.code != 1 || !strings.Contains(r.stderr, "used up") {
		t.Fatalf("second use of a join token: exit %d %s", r.code, r.stderr)
	}
	r = meshnode(t, nil, "token", "create", "--json", "--data-dir", nodes[0].dir)
	json.Unmarshal([]byte(r.stdout), &jt)
	if r := meshnode(t, nil, append([]string{"join", "--token", jt.Token}, newMeshNode(t, "b").flags...)...); r.code != 1 || !strings.Contains(r.stderr, "has a server named b already") {
		t.Fatalf("join under a taken name: exit %d %s", r.code, r.stderr)
	}
}

// TestIntegration_LoseOne: kill -9 one of three nodes while a module emits 50,000 events and
// another handles them. Every event acknowledged to the emitter is handled; the audit log
// of each survivor holds every one; the mesh-scoped seat held on the killed node moves to a
// survivor with a higher epoch; registration still works; the node restarts, rejoins and
// catches up.
func TestIntegration_LoseOne(t *testing.T) {
	nodes, _, _ := formThree(t)
	a, b, c := nodes[0], nodes[1], nodes[2]
	op := filepath.Join(a.dir, "operator.nk")
	register := func(dir, text string) string { t.Helper(); return registerModule(t, dir, text, "--creds", op) }
	tickerSeed := register(a.dir, "module: ticker\nrequires: [mesh-bus]\nemits: [tick]\n")
	sinkSeed := register(a.dir, "module: sink\nrequires: [mesh-bus]\nconsumes: [ticker.tick]\n")
	workerSeed := register(a.dir, "module: worker\nrequires: [mesh-bus]\nseats:\n  jobs: {scope: mesh, retain: 1h, accepts: [run]}\n")
	connect := func(p *process, seed string) *sdk.Client {
		t.Helper()
		var cl *sdk.Client
		retryUntil(t, 20*time.Second, func() (err error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			cl, err = sdk.Connect(ctx, p.clientURL, seed)
			return err
		})
		t.Cleanup(func() { cl.Close() })
		return cl
	}

	// The seat's holder runs on a, the node that will die; a second candidate waits on b.
	onA := connect(a.p, workerSeed)
	noop := func(context.Context, sdk.Job) error { return nil }
	if err := onA.Accept("run", noop); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		if ok, _ := onA.Holding("jobs"); !ok {
			return errors.New("the instance on a does not hold the seat yet")
		}
		return nil
	})
	_, epochA := onA.Holding("jobs")
	onB := connect(b.p, workerSeed)
	if err := onB.Accept("run", noop); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	handled := map[string]bool{}
	sink := connect(c.p, sinkSeed)
	if err := sink.On("ticker.tick", func(_ context.Context, e sdk.Event) error {
		mu.Lock()
		handled[e.ID] = true
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	const total, workers, killAt = 50_000, 16, 15_000
	ticker := connect(b.p, tickerSeed)
	var acked []string
	var killed sync.Once
	moved := make(chan time.Duration, 1) // how long after the kill b's instance held the seat
	kill := func() {
		killed.Do(func() {
			a.p.cmd.Process.Kill()
			<-a.p.done
			killedAt := time.Now()
			go func() {
				for time.Since(killedAt) < time.Minute {
					if ok, epoch := onB.Holding("jobs"); ok && epoch > epochA {
						moved <- time.Since(killedAt)
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		})
	}
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += workers {
				deadline := time.Now().Add(30 * time.Second)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					id, err := ticker.Emit(ctx, "tick", map[string]int{"n": i})
					cancel()
					if err == nil {
						mu.Lock()
						acked = append(acked, id)
						n := len(acked)
						mu.Unlock()
						if n == killAt {
							go kill()
						}
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("emit %d not acknowledged for 30s: %v", i, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	kill()
	t.Logf("%d events acknowledged in %s across the kill of node a", len(acked), time.Since(start))

	// The seat moves to the candidate on b, under a higher epoch.
	select {
	case d := <-moved:
		t.Logf("the seat moved to b %s after the kill", d)
	case <-time.After(time.Minute):
		ok, epoch := onB.Holding("jobs")
		t.Fatalf("a minute after the kill, the instance on b holds the seat: %v, epoch %d (a had %d)", ok, epoch, epochA)
	}

	// Every acknowledged event is handled.
	retryUntil(t, 90*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		missing := 0
		for _, id := range acked {
			if !handled[id] {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d acknowledged events not handled", missing, len(acked))
		}
		return nil
	})

	// Registration still works with one node down.
	register(b.dir, "module: late\nrequires: [mesh-bus]\n")

	// Each survivor's audit log holds every acknowledged event, once.
	complete := func(n *meshNode) error {
		ids, err := queryAuditIDs(t, n.dir, op, "ticker")
		if err != nil {
			return err
		}
		for id, k := range ids {
			if k != 1 {
				return fmt.Errorf("%s: event %s recorded %d times", n.name, id, k)
			}
		}
		for _, id := range acked {
			if ids[id] != 1 {
				return fmt.Errorf("%s: %d events recorded, acknowledged event %s missing", n.name, len(ids), id)
			}
		}
		return nil
	}
	for _, n := range []*meshNode{b, c} {
		retryUntil(t, 90*time.Second, func() error { return complete(n) })
	}

	// The killed node restarts, rejoins and catches up.
	a.p = startNode(t, "run", a.flags...)
	retryUntil(t, 30*time.Second, func() error {
		r := meshnode(t, nil, "members", "--json", "--data-dir", b.dir)
		if strings.Count(r.stdout, `"state":"alive"`) != 3 {
			return fmt.Errorf("members after the restart: %s %s", r.stdout, r.stderr)
		}
		return nil
	})
	retryUntil(t, 120*time.Second, func() error { return complete(a) })
}

// TestIntegration_LeaveAndRemove: of four servers, one leaves gracefully (and its data dir then
// refuses to run); a leave that would leave fewer than three is refused; a live server
// cannot be removed; a killed one is reported unreachable and then removed. Each shows in
// members and in the audit log.
func TestIntegration_LeaveAndRemove(t *testing.T) {
	// a and b log at debug level: what a did about c's route, once, and every retry of a
	// route (which info level summarises once a minute).
	nodes, _, _ := formThreeWith(t, func(i int) []string {
		if i < 2 {
			return []string{"--log-level", "debug"}
		}
		return nil
	})
	a, b, c := nodes[0], nodes[1], nodes[2]
	op := filepath.Join(a.dir, "operator.nk")
	r := meshnode(t, nil, "token", "create", "--json", "--data-dir", a.dir)
	var jt struct{ Token string }
	if json.Unmarshal([]byte(r.stdout), &jt); r.code != 0 {
		t.Fatalf("token create: exit %d %s", r.code, r.stderr)
	}
	d := newMeshNode(t, "d")
	d.p = startNode(t, "join", append([]string{"--token", jt.Token}, d.flags...)...)

	if r := meshnode(t, nil, "leave", "--data-dir", c.dir, "--creds", op); r.code != 0 || !strings.Contains(r.stdout, "left mesh") {
		t.Fatalf("leave: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	select {
	case <-c.p.done:
		if code := c.p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("the node that left exited %d\n%s", code, c.p.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the node that left still runs 20s later")
	}
	retryUntil(t, 20*time.Second, func() error {
		st, err := memberStates(t, a.dir)
		if err != nil || st["c"] != "left/none" {
			return fmt.Errorf("members after c left: %v %v", st, err)
		}
		return nil
	})
	// Every member drops its route to c (a was started with it; b learnt it) rather than
	// retry it for ever: from here to the end of the bed, no second attempt at c's cluster
	// address (a server that hears of c from another may try it once).
	noRetries := func(n *meshNode, gone *meshNode, why string) {
		route, from := flagValue(gone.flags, "--cluster-addr"), len(n.p.stderr.String())
		t.Cleanup(func() {
			retried := regexp.MustCompile(`Error trying to connect to route \(attempt ([2-9]|\d\d+)\): dial tcp ` + regexp.QuoteMeta(route))
			if log := n.p.stderr.String()[from:]; len(retried.FindAllString(log, -1)) > 1 {
				t.Errorf("%s retried its route to %s (%s) after %s %s: it was not dropped\n%s", n.name, gone.name, route, gone.name, why, log)
			}
		})
	}
	noRetries(a, c, "left")
	noRetries(b, c, "left")
	dropped := regexp.MustCompile(`msg="dropped the route to a server that is gone" .*peer=c `)
	droppedOnce := func() error {
		if n := len(dropped.FindAllString(a.p.stderr.String(), -1)); n != 1 {
			return fmt.Errorf("a logged the drop of c's route %d times, want once", n)
		}
		return nil
	}
	retryUntil(t, 10*time.Second, droppedOnce)
	t.Cleanup(func() { // and not again, to the end of the bed
		if err := droppedOnce(); err != nil {
			t.Error(err)
		}
	})
	if r := meshnode(t, nil, append([]string{"run"}, c.flags...)...); r.code != 1 || !strings.Contains(r.stderr, "left its mesh") {
		t.Fatalf("run after leave: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, "leave", "--data-dir", d.dir, "--creds", op); r.code != 1 || !strings.Contains(r.stderr, "leaving would leave 2 servers") {
		t.Fatalf("a leave down to two servers: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, "node", "remove", "d", "--data-dir", a.dir, "--creds", op); r.code != 1 || !strings.Contains(r.stderr, "d is alive") {
		t.Fatalf("removing a live server: exit %d %s", r.code, r.stderr)
	}

	d.p.cmd.Process.Kill()
	<-d.p.done
	killed := time.Now()
	retryUntil(t, 30*time.Second, func() error {
		st, err := memberStates(t, a.dir)
		if err != nil || !strings.HasPrefix(st["d"], "dead/") {
			return fmt.Errorf("members after d was killed: %v %v", st, err)
		}
		return nil
	})
	t.Logf("gossip declared the killed server dead after %s", time.Since(killed))
	if r := meshnode(t, nil, "node", "remove", "d", "--data-dir", a.dir, "--creds", op); r.code != 0 {
		t.Fatalf("node remove: exit %d %s", r.code, r.stderr)
	}
	// Removed, the dead server is not retried by any member (a server that joined later is an
	// implicit route, which nats-server tries once).
	noRetries(a, d, "was removed")
	noRetries(b, d, "was removed")
	st, err := memberStates(t, a.dir)
	if _, listed := st["d"]; err != nil || listed || st["a"] == "" {
		t.Fatalf("members after d was removed: %v %v", st, err)
	}
	if r := meshnode(t, nil, "node", "remove", "zz", "--data-dir", a.dir, "--creds", op); r.code != 1 || !strings.Contains(r.stderr, "no server named zz") {
		t.Fatalf("removing an unknown server: exit %d %s", r.code, r.stderr)
	}
	retryUntil(t, 20*time.Second, func() error {
		ev := nodeEvents(t, a.dir, op)
		// A node reports another's end under its own name: d's unreachable by the controller's
		// holder, whichever node that is; d's removal by a, which removed it.
		for _, want := range []string{"mesh.node.d.event.joined", "mesh.node.c.event.left", ".event.member-unreachable:d", "mesh.node.a.event.member-removed:d"} {
			if !strings.Contains(ev, want) {
				return fmt.Errorf("no %s in the audit log: %s", want, ev)
			}
		}
		return nil
	})
	// Every event the mesh published about itself, a death and a removal included, is genuine.
	verify := func(n *meshNode) api.AuditVerification {
		v := meshnode(t, nil, "audit", "verify", "--json", "--data-dir", n.dir, "--creds", op)
		var got api.AuditVerification
		if err := json.Unmarshal([]byte(v.stdout), &got); err != nil || v.code != 0 {
			t.Fatalf("audit verify on %s: exit %d (%v) %s", n.name, v.code, err, v.stderr)
		}
		return got
	}
	for _, n := range []*meshNode{a, b} {
		if v := verify(n); v.FlaggedTotal != 0 {
			t.Fatalf("audit verify on %s: %d flagged %+v", n.name, v.FlaggedTotal, v.Flagged)
		}
	}
	// Every name the log prints — the mesh's own kinds among them: joined, left, a member
	// unreachable or removed, seats held, declarations applied — finds its records again.
	byName := func(args ...string) map[string]int {
		r := meshnode(t, nil, append([]string{"audit", "query", "--json", "--data-dir", a.dir, "--creds", op}, args...)...)
		names := map[string]int{}
		for line := range strings.Lines(r.stdout) {
			var rec struct{ Key string }
			if json.Unmarshal([]byte(line), &rec) == nil {
				names[rec.Key]++
			}
		}
		if r.code != 0 {
			t.Fatalf("audit query %v: exit %d %s", args, r.code, r.stderr)
		}
		return names
	}
	printed := byName()
	for _, kind := range []string{"node.c.left", "node.a.member-removed"} {
		if printed[kind] == 0 {
			t.Errorf("no %s among the names the log prints: %v", kind, printed)
		}
	}
	for name, n := range printed {
		if got := byName("--event", name); got[name] < n { // more may have come since
			t.Errorf("audit query --event %s finds %d of its %d records (%v)", name, got[name], n, got)
		}
	}
	// Forged with the key of d, a server that is gone and does not hold mesh-controller: a
	// controller's event, and b's joined. Each node's log flags both, and counts them. (d
	// may have held the seat after c left; a forgery read while the lease of a removed
	// server is the last one a node saw has no key to be checked with — unknown-source —
	// so the seat is first held by a live server.)
	retryUntil(t, time.Minute, func() error {
		r := meshnode(t, nil, "seat", "ls", "--json", "--data-dir", a.dir, "--creds", op)
		for line := range strings.Lines(r.stdout) {
			var st struct {
				Seat   string
				Holder string `json:"holder_node"`
			}
			if json.Unmarshal([]byte(line), &st) == nil && st.Seat == manifest.ControllerSeat {
				if st.Holder == "a" || st.Holder == "b" {
					return nil
				}
				return fmt.Errorf("mesh-controller is held on %q", st.Holder)
			}
		}
		return fmt.Errorf("seat ls: exit %d, no mesh-controller: %s %s", r.code, r.stdout, r.stderr)
	})
	db, err := bolt.Open(filepath.Join(d.dir, "meshnode.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	f, err := genesis.New(db).Foundation()
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	dKey, err := f.NodeKey()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := operatorConn(a.p.clientURL, a.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, forged := range []struct{ source, subject string }{
		{manifest.ControllerSeat, manifest.SeatEventSubject(manifest.ControllerSeat, "provisioned")},
		{"b", manifest.NodeEventSubject("b", "joined")},
	} {
		h, err := envelope.Stamp(dKey, forged.source, "d", forged.subject, []byte(`{}`), envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(&nats.Msg{Subject: forged.subject, Header: h, Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*meshNode{a, b} {
		retryUntil(t, 20*time.Second, func() error {
			v := verify(n)
			if v.FlaggedTotal != 2 {
				return fmt.Errorf("%s flags %d: %+v, want the 2 forgeries", n.name, v.FlaggedTotal, v.Flagged)
			}
			for _, fl := range v.Flagged {
				if fl.Kind != api.AuditFlagBadSignature {
					return fmt.Errorf("%s flags %+v, want a bad signature", n.name, fl)
				}
			}
			return nil
		})
		counted := map[string]float64{}
		for _, kind := range audit.NotGenuineKinds {
			if v := metricValue(t, n.p.httpURL, `meshnode_audit_not_genuine_total{kind="`+kind+`"}`); v > 0 {
				counted[kind] = v
			}
		}
		if counted[api.AuditFlagBadSignature] != 2 || len(counted) > 1 {
			t.Errorf("%s: meshnode_audit_not_genuine_total counts %v, want the 2 forgeries", n.name, counted)
		}
		t.Logf("%s counted the forgeries as %v", n.name, counted)
	}
}

// metricValue is the value of one series (name with its labels, as /metrics prints it) of
// the node at httpURL; -1 when it is not there.
func metricValue(t *testing.T, httpURL, series string) float64 {
	t.Helper()
	resp, err := http.Get(httpURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(body)) {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// TestIntegration_SignalDuringFormation: SIGTERM at several points of a three-node formation —
// while the joiner asks for its credentials, while its server starts, while JetStream elects
// its leaders, while the mesh's buckets and streams are made — stops the process within the
// shutdown timeout (5 s), with exit 0.
func TestIntegration_SignalDuringFormation(t *testing.T) {
	for _, after := range []time.Duration{50 * time.Millisecond, 300 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second} {
		t.Run(after.String(), func(t *testing.T) {
			for attempt := 1; attempt <= 3; attempt++ {
				if !signalFormation(t, after) {
					return
				}
				t.Logf("attempt %d: a node lost a port picked free to another process; again", attempt)
			}
			t.Fatal("three attempts lost a port to another process")
		})
	}
}

// signalFormation launches a three-node formation, signals every node after the given time
// and checks each stops in time, with exit 0. It reports a lost port (a node that could not
// bind an address picked free, taken meanwhile by another test's process) instead of failing.
func signalFormation(t *testing.T, after time.Duration) (lostPort bool) {
	t.Helper()
	nodes := []*meshNode{newMeshNode(t, "a"), newMeshNode(t, "b"), newMeshNode(t, "c")}
	for _, n := range nodes {
		n.flags = append(n.flags, "--log-level", "info") // the last one given counts
	}
	r := meshnode(t, nil, append([]string{"genesis", "--expect", "3", "--json"}, nodes[0].flags...)...)
	if r.code != 0 {
		t.Fatalf("genesis: %s", r.stderr)
	}
	var g map[string]any
	json.Unmarshal([]byte(r.stdout), &g)
	token, _ := g["founding_token"].(string)
	launchFounders(t, nodes, token)
	// From the first line each process logs (info: the node's certificate, within
	// milliseconds of its start), which it does after it catches signals: before
	// its main starts (tens of milliseconds on a loaded machine) a signal kills any process.
	retryUntil(t, 30*time.Second, func() error {
		for _, n := range nodes {
			if n.p.stderr.String() == "" {
				return fmt.Errorf("%s has logged nothing yet", n.name)
			}
		}
		return nil
	})
	time.Sleep(after) // a point of the formation to signal at, not a wait for a state
	type result struct {
		name string
		code int
		took time.Duration
		lost bool
		log  string
	}
	results := make(chan result, len(nodes))
	for _, n := range nodes { // all at once: none waits for a peer that is going
		go func() {
			start := time.Now()
			n.p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-n.p.done:
			case <-time.After(20 * time.Second):
				n.p.cmd.Process.Kill()
				<-n.p.done
				results <- result{n.name, -1, 20 * time.Second, false, n.p.stderr.String()}
				return
			}
			log := n.p.stderr.String()
			results <- result{n.name, n.p.cmd.ProcessState.ExitCode(), time.Since(start), strings.Contains(log, "address already in use"), log}
		}()
	}
	var failed []result
	for range nodes {
		r := <-results
		lostPort = lostPort || r.lost
		if r.code != 0 || r.took > 6*time.Second {
			failed = append(failed, r)
		}
	}
	if lostPort {
		return true
	}
	for _, r := range failed {
		t.Errorf("%s after %s: exit %d, %s to stop\n%s", r.name, after, r.code, r.took, r.log)
	}
	return false
}

// TestIntegration_StopWithPeersGone: the last node of a mesh whose other two have stopped stops
// within the shutdown timeout too, though nothing answers its releases any more.
func TestIntegration_StopWithPeersGone(t *testing.T) {
	nodes, _, _ := formThree(t)
	for _, n := range nodes {
		code, took := n.p.stop(t, syscall.SIGTERM)
		if code != 0 || took > 6*time.Second {
			t.Errorf("%s: exit %d, %s to stop\n%s", n.name, code, took, n.p.stderr)
		}
	}
	if os.Getenv("MESHNODE_TEST_LOG") != "" { // with debug logs: what the last one waited for
		t.Log(nodes[2].p.stderr.String())
	}
}

// formThree runs genesis --expect 3 for a and starts a, b and c, the latter two with the
// founding token; it returns once all three are ready.
func formThree(t *testing.T) (nodes []*meshNode, meshID, token string) {
	t.Helper()
	return formThreeWith(t, nil)
}

// formThreeWith is formThree with flags added to node i's by extra.
func formThreeWith(t *testing.T, extra func(i int) []string) (nodes []*meshNode, meshID, token string) {
	t.Helper()
	return formMesh(t, 3, extra)
}

// formMesh runs genesis --expect n for a and starts the n founding servers a, b, c, … (extra,
// if not nil, adds flags to node i's), all but a with the founding token; it returns once all
// of them are ready.
func formMesh(t *testing.T, n int, extra func(i int) []string) (nodes []*meshNode, meshID, token string) {
	t.Helper()
	for i := range n {
		nodes = append(nodes, newMeshNode(t, string(rune('a'+i))))
	}
	if extra != nil {
		for i, n := range nodes {
			n.flags = append(n.flags, extra(i)...)
		}
	}
	r := meshnode(t, nil, append([]string{"genesis", "--expect", strconv.Itoa(n), "--json"}, nodes[0].flags...)...)
	if r.code != 0 {
		t.Fatalf("genesis: %s", r.stderr)
	}
	var g map[string]any
	json.Unmarshal([]byte(r.stdout), &g)
	token, _ = g["founding_token"].(string)
	if !strings.HasPrefix(token, "MNF1.") {
		t.Fatalf("no founding token: %s", r.stdout)
	}
	meshID, _ = g["mesh_id"].(string)
	start := time.Now()
	launchFounders(t, nodes, token)
	for _, n := range nodes {
		n.p.awaitReady(t, 90*time.Second)
		if n.p.meshID != meshID {
			t.Fatalf("node %s reports mesh %s, want %s", n.name, n.p.meshID, meshID)
		}
	}
	t.Logf("%d processes formed a ready mesh in %s", n, time.Since(start))
	return nodes, meshID, token
}

// foundingToken encodes a founding token, as genesis prints it.
func foundingToken(f genesis.Founding) string {
	b, _ := json.Marshal(f)
	return genesis.FoundingPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// memberStates returns each member's state and JetStream role as the node on dir sees them.
func memberStates(t *testing.T, dir string) (map[string]string, error) {
	r := meshnode(t, nil, "members", "--json", "--data-dir", dir)
	if r.code != 0 {
		return nil, fmt.Errorf("members: exit %d %s", r.code, r.stderr)
	}
	out := map[string]string{}
	for line := range strings.Lines(r.stdout) {
		var m struct{ Name, State, JetStream string }
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			return nil, err
		}
		out[m.Name] = m.State + "/" + m.JetStream
	}
	return out, nil
}

// nodeEvents returns the subjects of the node events in the audit log of the node on dir,
// each reporting on another node followed by ":" and that node.
func nodeEvents(t *testing.T, dir, creds string) string {
	r := meshnode(t, nil, "audit", "query", "--json", "--data-dir", dir, "--creds", creds)
	var subjects []string
	for line := range strings.Lines(r.stdout) {
		var rec struct {
			Subject string
			Body    json.RawMessage
		}
		if json.Unmarshal([]byte(line), &rec) != nil || !strings.HasPrefix(rec.Subject, "mesh.node.") {
			continue
		}
		var about struct{ Node string }
		if json.Unmarshal(rec.Body, &about); about.Node != "" && !strings.HasPrefix(rec.Subject, "mesh.node."+about.Node+".") {
			rec.Subject += ":" + about.Node // what it reports on: another node
		}
		subjects = append(subjects, rec.Subject)
	}
	return strings.Join(subjects, " ")
}

// launchFounders starts the founding nodes: the genesis node with run, the others with
// join — c given the token in the environment, every other one in a file: never on a
// command line.
func launchFounders(t *testing.T, nodes []*meshNode, token string) {
	t.Helper()
	nodes[0].p = launch(t, "run", nodes[0].flags...)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes[1:] {
		if i+1 == 2 {
			cmd := exec.Command(binary, append([]string{"join"}, n.flags...)...)
			cmd.Env = append(cleanEnv(), config.TokenEnv+"="+token)
			n.p = launchCmd(t, cmd, "join")
			continue
		}
		n.p = launch(t, "join", append([]string{"--token-file", tokenFile}, n.flags...)...)
	}
}

// TestIntegration_GrowOneToThree: a single node (genesis, run) with three registered
// modules, five secrets, 10,000 events, a seat held by a process that handles none of its 100
// queued jobs yet, and an audit log of it all grows into a mesh of three processes —
// `grow --expect 3 --json` on it (/readyz says what it waits for), `join` with its
// token on two new ones. The single node restarts by itself, in the same process; killed -9
// while it waits, as it restarts, while it snapshots and while it restores, it starts again
// and goes on; all three
// become ready as three JetStream peers. Every event reaches a new node's audit log, the
// jobs wait in the seat's queue under its holder and the secrets read the same; then one of
// the three is killed -9 and the other two still read every secret and the queue, take a
// new event, and the grown node's audit log verifies; last, the holder handles every job.
func TestIntegration_GrowOneToThree(t *testing.T) {
	a := newMeshNode(t, "a")
	// Its phases, to kill it at; fixed client and HTTP ports, for the seat's holder to come
	// back to across its restarts and for /readyz.
	httpA := testbed.FreeAddr(t)
	a.flags = append(a.flags, "--log-level", "info", "--client-addr", testbed.FreeAddr(t), "--http-addr", httpA)
	if r := meshnode(t, nil, append([]string{"genesis"}, a.flags...)...); r.code != 0 {
		t.Fatalf("genesis: exit %d %s", r.code, r.stderr)
	}
	a.p = startNode(t, "run", a.flags...)
	op := filepath.Join(a.dir, "operator.nk")
	mailer := registerModule(t, a.dir, "module: mailer\nrequires: [mesh-bus]\nseats:\n  mail: {scope: mesh, retain: 1d, accepts: [send]}\n")
	shop := registerModule(t, a.dir, "module: shop\nrequires: [mesh-bus]\nemits: [sold]\nuses: [mail]\nsecrets: [k1, k2, k3, k4, k5]\n")
	registerModule(t, a.dir, "module: ledger\nrequires: [mesh-bus]\nconsumes: [shop.sold]\n") // a durable consumer of every event, to carry over
	// mailer holds the seat, and handles no job until the gate opens: the jobs stay queued.
	gate := filepath.Join(t.TempDir(), "gate")
	holderOut := &testbed.SyncBuffer{}
	holder := exec.Command(os.Args[0])
	holder.Env = append(cleanEnv(), "MESHNODE_TEST_HOLDER="+a.p.clientURL, "MESHNODE_TEST_HOLDER_SEED="+mailer, "MESHNODE_TEST_HOLDER_GATE="+gate)
	holder.Stdout, holder.Stderr = holderOut, holderOut
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	retryUntil(t, 30*time.Second, func() error {
		if !strings.Contains(holderOut.String(), "held ") {
			return fmt.Errorf("mailer does not hold seat mail: %s", holderOut)
		}
		return nil
	})
	secrets := map[string]string{}
	for _, k := range []string{"k1", "k2", "k3", "k4", "k5"} {
		if r := meshnode(t, nil, "vault", "mint", k, "--owner", "shop", "--data-dir", a.dir); r.code != 0 {
			t.Fatalf("vault mint %s: exit %d %s", k, r.code, r.stderr)
		}
		r := meshnode(t, nil, "vault", "fetch", k, "--owner", "shop", "--data-dir", a.dir)
		if r.code != 0 || r.stdout == "" {
			t.Fatalf("vault fetch %s: exit %d %s", k, r.code, r.stderr)
		}
		secrets[k] = r.stdout
	}
	loader := exec.Command(os.Args[0])
	loader.Env = append(cleanEnv(), "MESHNODE_TEST_LOADER="+a.p.clientURL, "MESHNODE_TEST_LOADER_SEED="+shop)
	if out, err := loader.CombinedOutput(); err != nil || !strings.Contains(string(out), "loaded") {
		t.Fatalf("load the single node: %v\n%s", err, out)
	}
	// The single node's audit log has every event before it grows.
	retryUntil(t, time.Minute, func() error {
		if n := len(auditIDs(t, a.dir, op, "shop")); n != loaderEvents {
			return fmt.Errorf("a's audit log has %d of shop's %d events", n, loaderEvents)
		}
		return nil
	})
	backlog := func(dir string) error {
		r := meshnode(t, nil, "seat", "ls", "--json", "--data-dir", dir, "--creds", op)
		for line := range strings.Lines(r.stdout) {
			var st struct {
				Seat, Holder string
				Backlog      uint64
			}
			if json.Unmarshal([]byte(line), &st) == nil && st.Seat == "mail" {
				if st.Backlog != loaderJobs || st.Holder == "" {
					return fmt.Errorf("seat mail has %d jobs queued (want %d), holder %q (want mailer's instance; it said %q)", st.Backlog, loaderJobs, st.Holder, holderOut)
				}
				return nil
			}
		}
		return fmt.Errorf("seat ls: exit %d, no seat mail: %s %s", r.code, r.stdout, r.stderr)
	}
	if err := backlog(a.dir); err != nil {
		t.Fatal(err)
	}

	if r := meshnode(t, nil, "grow", "--expect", "2", "--data-dir", a.dir); r.code != 2 {
		t.Fatalf("grow --expect 2: exit %d %s, want a usage error", r.code, r.stderr)
	}
	r := meshnode(t, nil, "grow", "--expect", "3", "--json", "--data-dir", a.dir)
	checkJSON(t, "grow", r.stdout)
	var g struct {
		Token string
		Uses  int
	}
	if json.Unmarshal([]byte(r.stdout), &g); r.code != 0 || !strings.HasPrefix(g.Token, "MNJ1.") || g.Uses != 2 {
		t.Fatalf("grow: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, "listens on loopback only") || !strings.Contains(r.stderr, "--advertise") {
		t.Fatalf("grow of a node on loopback does not say that only this machine can join it: %s", r.stderr)
	}
	if r := meshnode(t, nil, "status", "--data-dir", a.dir); !strings.Contains(r.stdout, "waiting for 2 more to join") {
		t.Fatalf("status while growing: %s %s", r.stdout, r.stderr)
	}
	// Still serving while it waits, and saying what it waits for.
	if code, body := readyz(t, httpA); code != 200 || !strings.Contains(body.Growing, "waiting for 2 more to join") {
		t.Fatalf("/readyz while growing: %d %+v", code, body)
	}
	// kill -9 while it waits for the new servers: it starts again, serving and still waiting.
	a.p.cmd.Process.Kill()
	<-a.p.done
	a.p = startNode(t, "run", a.flags...)
	if r := meshnode(t, nil, "status", "--data-dir", a.dir); !strings.Contains(r.stdout, "waiting for 2 more to join") {
		t.Fatalf("status after a kill while waiting to grow: %s %s", r.stdout, r.stderr)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(g.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	b, c := newMeshNode(t, "b"), newMeshNode(t, "c")
	b.p = launch(t, "join", append([]string{"--token-file", tokenFile}, b.flags...)...)
	c.p = launch(t, "join", append([]string{"--token-file", tokenFile}, c.flags...)...)
	// kill -9 the growing node as it restarts to migrate, as it snapshots, and as it
	// restores: each time it starts again and goes on (the foundation records each phase
	// before the next).
	for _, at := range []string{"every server of the mesh is here", "snapshot taken", "restored into the mesh"} {
		retryUntil(t, 2*time.Minute, func() error {
			if !strings.Contains(a.p.stderr.String(), at) {
				return fmt.Errorf("a has not logged %q yet", at)
			}
			return nil
		})
		a.p.cmd.Process.Kill()
		<-a.p.done
		// A start that fails says what the one killed before it did.
		killed := a.p.stderr
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("a's start killed after %q:\n%s", at, killed)
			}
		})
		a.p = launch(t, "run", a.flags...)
	}
	a.p.awaitReady(t, 3*time.Minute)
	b.p.awaitReady(t, 3*time.Minute)
	c.p.awaitReady(t, 3*time.Minute)
	retryUntil(t, 30*time.Second, func() error {
		st, err := memberStates(t, a.dir)
		if err != nil || len(st) != 3 {
			return fmt.Errorf("members %v %v", st, err)
		}
		for name, s := range st {
			if !strings.HasPrefix(s, "alive/") || strings.HasSuffix(s, "/standalone") || strings.HasSuffix(s, "/none") {
				return fmt.Errorf("member %s is %s", name, s)
			}
		}
		return nil
	})
	if r := meshnode(t, nil, "module", "ls", "--data-dir", c.dir, "--creds", op); r.code != 0 || !strings.Contains(r.stdout, "shop") || !strings.Contains(r.stdout, "mailer") || !strings.Contains(r.stdout, "ledger") {
		t.Fatalf("module ls on a new node: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if code, body := readyz(t, httpA); code != 200 || body.Growing != "" {
		t.Fatalf("/readyz of the grown node: %d %+v", code, body)
	}
	retryUntil(t, time.Minute, func() error { return backlog(c.dir) }) // held through the growth
	// Through four kills and the growth the node never refused the holder's key: it holds a
	// connect until it has read its registry, and its port is closed while it restores.
	if strings.Contains(holderOut.String(), "refuses this module's key") {
		t.Fatalf("the node refused the holder's key while it restarted or grew:\n%s", holderOut)
	}
	if r := meshnode(t, nil, "status", "--data-dir", a.dir); r.code != 0 || strings.Contains(r.stdout, "growing") {
		t.Fatalf("status after growing: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	// A new node's audit log is made from the restored EVENTS: every event, once.
	retryUntil(t, 2*time.Minute, func() error {
		ids, err := queryAuditIDs(t, c.dir, op, "shop")
		if err != nil {
			return err
		}
		if len(ids) != loaderEvents {
			return fmt.Errorf("c's audit log has %d of shop's %d events", len(ids), loaderEvents)
		}
		for id, n := range ids {
			if n != 1 {
				return fmt.Errorf("c's audit log has event %s %d times", id, n)
			}
		}
		return nil
	})

	// A deploy on the grown mesh, and the kv it provisions: the controller's events.
	registerModule(t, a.dir, "module: runner\nrequires: [mesh-bus, kv]\n")
	script := filepath.Join(t.TempDir(), "runner.sh")
	os.WriteFile(script, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755)
	if r := meshnode(t, nil, "artifact", "put", "runner", script, "--version", "1", "--data-dir", a.dir, "--creds", op); r.code != 0 {
		t.Fatalf("artifact put: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, "deploy", "runner", "--version", "1", "--nodes", "a", "--wait", "60s", "--data-dir", a.dir, "--creds", op); r.code != 0 {
		t.Fatalf("deploy on the grown mesh: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := meshnode(t, nil, "provisions", "--json", "--data-dir", a.dir, "--creds", op); r.code != 0 || !strings.Contains(r.stdout, `"state":"ready"`) {
		t.Fatalf("runner's kv: exit %d %s %s", r.code, r.stdout, r.stderr)
	}

	// kill -9 one of the three: the other two read everything and take new events.
	b.p.cmd.Process.Kill()
	<-b.p.done
	for _, dir := range []string{a.dir, c.dir} {
		retryUntil(t, time.Minute, func() error { return backlog(dir) })
		for k, want := range secrets {
			retryUntil(t, time.Minute, func() error {
				r := meshnode(t, nil, "vault", "fetch", k, "--data-dir", dir, "--creds", shop) // as the module
				if r.code != 0 || r.stdout != want {
					return fmt.Errorf("secret %s through %s with b killed: exit %d %q %s", k, dir, r.code, r.stdout, r.stderr)
				}
				return nil
			})
		}
	}
	retryUntil(t, time.Minute, func() error {
		if r := meshnode(t, nil, "emit", "sold", `{"n":-1}`, "--data-dir", c.dir, "--creds", shop); r.code != 0 {
			return fmt.Errorf("emit through c with b killed: exit %d %s", r.code, r.stderr)
		}
		return nil
	})
	retryUntil(t, time.Minute, func() error {
		if n := len(auditIDs(t, a.dir, op, "shop")); n < loaderEvents+1 {
			return fmt.Errorf("a's audit log has %d of shop's %d events", n, loaderEvents+1)
		}
		return nil
	})
	// Killed, grown, deployed and provisioned, the mesh's own events are all genuine on every
	// live node: b's end is reported under its reporter's name, the kv's provision under the
	// controller's.
	for _, n := range []*meshNode{a, c} {
		retryUntil(t, time.Minute, func() error {
			for _, want := range []string{"node.*.member-unreachable", "seat.mesh-controller.provisioned"} {
				if r := meshnode(t, nil, "audit", "query", "--event", want, "--json", "--data-dir", n.dir, "--creds", op); r.code != 0 || r.stdout == "" {
					return fmt.Errorf("%s's audit log has no %s yet: exit %d %s", n.name, want, r.code, r.stderr)
				}
			}
			return nil
		})
		v := meshnode(t, nil, "audit", "verify", "--json", "--data-dir", n.dir, "--creds", op)
		var got api.AuditVerification
		if err := json.Unmarshal([]byte(v.stdout), &got); err != nil || v.code != 0 || got.FlaggedTotal != 0 {
			t.Fatalf("audit verify on %s: exit %d (%v) %d flagged: %+v %s", n.name, v.code, err, got.FlaggedTotal, got.Flagged, v.stderr)
		}
	}
	// The gate opens: the holder, which held the seat through the growth, handles every job
	// queued before it, each with the body it was submitted with.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 2*time.Minute, func() error {
		seen := map[string]bool{}
		for line := range strings.Lines(holderOut.String()) {
			if n, ok := strings.CutPrefix(strings.TrimSpace(line), "job "); ok {
				seen[n] = true
			}
		}
		for i := range loaderJobs {
			if !seen[strconv.Itoa(i)] {
				return fmt.Errorf("the holder has handled %d of the %d jobs; job %d not yet", len(seen), loaderJobs, i)
			}
		}
		return nil
	})
}

// readyzBody is what /readyz answers.
type readyzBody struct{ Status, Reason, Growing string }

// readyz asks the node on HTTP address addr for /readyz.
func readyz(t *testing.T, addr string) (int, readyzBody) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("/readyz: %v", err)
	}
	defer resp.Body.Close()
	var body readyzBody
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// TestIntegration_Binary_FormationProgress: a founding node waiting for the others says so in `status`
// (and exits 1, not ready) and on its HTTP address from the start — /healthz 200, /readyz
// 503 with the reason, answered while it waits — and stops promptly on SIGTERM.
func TestIntegration_Binary_FormationProgress(t *testing.T) {
	a := newMeshNode(t, "a")
	httpAddr := testbed.FreeAddr(t)
	a.flags = append(a.flags, "--http-addr", httpAddr)
	if r := meshnode(t, nil, append([]string{"genesis", "--expect", "3"}, a.flags...)...); r.code != 0 {
		t.Fatalf("genesis: %s", r.stderr)
	}
	// systemd's notify socket: the node says why it is not ready yet, and extends its start.
	sock := filepath.Join(t.TempDir(), "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	cmd := exec.Command(binary, append([]string{"run"}, a.flags...)...)
	cmd.Env = append(cleanEnv(), "NOTIFY_SOCKET="+sock)
	a.p = launchCmd(t, cmd, "run")
	notify.SetReadDeadline(time.Now().Add(20 * time.Second))
	for buf := make([]byte, 4096); ; {
		n, err := notify.Read(buf)
		if err != nil {
			t.Fatalf("no STATUS of the formation on the notify socket: %v", err)
		}
		if msg := string(buf[:n]); strings.Contains(msg, "STATUS=waiting for 2 more node(s)") && strings.Contains(msg, "EXTEND_TIMEOUT_USEC=300000000") {
			break
		}
	}
	retryUntil(t, 20*time.Second, func() error {
		r := meshnode(t, nil, "status", "--data-dir", a.dir)
		if r.code != 1 || !strings.Contains(r.stderr, "is not ready: forming the mesh: waiting for 2 more node(s)") || !strings.Contains(r.stdout, "have a") {
			return fmt.Errorf("status while forming: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		return nil
	})
	// Answered while forming, not held until the mesh forms (how fast is a benchmark's
	// business, not a test's).
	quick := &http.Client{Timeout: 2 * time.Second}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503} {
		resp, err := quick.Get("http://" + httpAddr + path)
		if err != nil {
			t.Fatalf("%s while forming: %v", path, err)
		}
		var body struct{ Reason string }
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == 503 && (!strings.Contains(body.Reason, "waiting for 2 more node(s)") || !strings.Contains(body.Reason, "have a"))) {
			t.Fatalf("%s while forming: %d %q", path, resp.StatusCode, body.Reason)
		}
	}
	if code, took := a.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("stop while forming: exit %d after %s\n%s", code, took, a.p.stderr)
	}
	if r := meshnode(t, nil, "status", "--data-dir", a.dir); r.code != 1 || !strings.Contains(r.stderr, "no meshnode is running") {
		t.Fatalf("status after the stop: exit %d %s", r.code, r.stderr)
	}

	// genesis kept the addresses it was given beside the data dir, so the unit's command —
	// run with the data dir alone — starts the same server: the same HTTP address answers,
	// still waiting for the same peers.
	kept, err := os.ReadFile(filepath.Join(a.dir, "meshnode.yaml"))
	if st, _ := os.Stat(filepath.Join(a.dir, "meshnode.yaml")); err != nil || st.Mode().Perm() != 0o600 ||
		!strings.Contains(string(kept), "cluster-addr: "+flagValue(a.flags, "--cluster-addr")) || !strings.Contains(string(kept), "http-addr: "+httpAddr) {
		t.Fatalf("meshnode.yaml after genesis: %v\n%s", err, kept)
	}
	a.p = launch(t, "run", "--data-dir", a.dir, "--log-level", "error")
	retryUntil(t, 20*time.Second, func() error {
		resp, err := quick.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return err
		}
		var body struct{ Reason string }
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != 503 || !strings.Contains(body.Reason, "waiting for 2 more node(s)") {
			return fmt.Errorf("/readyz of run --data-dir alone: %d %q", resp.StatusCode, body.Reason)
		}
		return nil
	})
	a.p.stop(t, syscall.SIGTERM)
}

// TestIntegration_Binary_RunTakesTheDataDirsName: `run` without --name (the unit's way) is the node its
// data dir holds, whatever the host is called; a --name that disagrees is refused, saying so.
func TestIntegration_Binary_RunTakesTheDataDirsName(t *testing.T) {
	dir := t.TempDir()
	addrs := []string{"--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--cluster-addr", testbed.FreeAddr(t), "--gossip-addr", testbed.FreeAddr(t)}
	if r := meshnode(t, nil, append([]string{"genesis", "--data-dir", dir, "--name", "first-node"}, addrs...)...); r.code != 0 {
		t.Fatalf("genesis: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"run", "--data-dir", dir, "--name", "other"}, addrs...)...); r.code != 1 || !strings.Contains(r.stderr, `holds node "first-node", not "other"`) {
		t.Fatalf("run with another --name: exit %d %s", r.code, r.stderr)
	}
	p := startNode(t, "run", append([]string{"--data-dir", dir}, addrs...)...)
	r := meshnode(t, nil, "status", "--json", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, `"name": "first-node"`) {
		t.Fatalf("status of a node run without --name: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	p.stop(t, syscall.SIGTERM)
	// Its log names it too: every line, not the host's default name it started with.
	if out := p.stderr.String(); !strings.Contains(out, "node=first-node") || strings.Contains(out, "node="+config.DefaultName()+" ") {
		t.Fatalf("the log of a node run without --name does not name it first-node throughout:\n%s", out)
	}
}

// TestIntegration_Binary_Advertise: a founding node whose cluster address binds every interface is
// refused until --advertise says which address reaches it; one that would advertise
// loopback to peers elsewhere is refused too.
func TestIntegration_Binary_Advertise(t *testing.T) {
	a := newMeshNode(t, "a")
	cluster := testbed.FreeAddr(t)
	_, port, _ := net.SplitHostPort(cluster)
	a.flags = append(a.flags, "--cluster-addr", "0.0.0.0:"+port)
	if r := meshnode(t, nil, append([]string{"genesis", "--expect", "3"}, a.flags...)...); r.code != 0 {
		t.Fatalf("genesis: %s", r.stderr)
	}
	r := meshnode(t, nil, append([]string{"run"}, a.flags...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "cluster-addr 0.0.0.0:"+port+" binds every interface") || !strings.Contains(r.stderr, "--advertise") {
		t.Fatalf("run binding 0.0.0.0 without --advertise: exit %d %s", r.code, r.stderr)
	}
	a.p = launch(t, "run", append(a.flags, "--advertise", "127.0.0.1")...)
	retryUntil(t, 20*time.Second, func() error {
		if r := meshnode(t, nil, "status", "--data-dir", a.dir); !strings.Contains(r.stdout+r.stderr, "waiting for 2 more node(s)") {
			return fmt.Errorf("status with --advertise: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		return nil
	})
	a.p.stop(t, syscall.SIGTERM)
	if r := meshnode(t, nil, "run", "--advertise", "0.0.0.0", "--data-dir", a.dir); r.code != 2 || !strings.Contains(r.stderr, "advertise") {
		t.Fatalf("--advertise 0.0.0.0: exit %d %s", r.code, r.stderr)
	}
}
