//go:build integration

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/seats"
	"github.com/meshnode/meshnode/vault"
)

// Issue 37's fault beds: meshes of five and seven server processes lose two servers at once
// (kill -9) — pairs chosen from the current leaders and replicas of the streams the mesh
// depends on — and keep registering, fetching secrets, taking audited events, failing a seat
// over and deploying; the two come back and the mesh converges.

// The streams whose replicas the beds kill: the registry's and the vault's buckets, EVENTS,
// the seat leases' bucket and the bed's seat's queue.
var (
	registryStream = "KV_" + registry.Bucket
	vaultStream    = "KV_" + vault.Bucket
	leasesStream   = "KV_" + seats.Bucket
	faultSeat      = "jobs"
	seatStream     = manifest.SeatStreamName(faultSeat)
	keyStreams     = []string{registryStream, vaultStream, manifest.EventsStreamName, leasesStream, seatStream}
)

// TestIntegration_FiveLoseTwo: a mesh of five (genesis --expect 5, four joins) loses two
// servers by kill -9, in turn: for each of the registry, the vault, EVENTS and the seat's
// queue, its leader and another of its replicas. With the two down, a module registers, a
// secret is fetched, an event is acknowledged and reaches every survivor's audit log, the
// seat is held by an instance on a survivor (a higher epoch if its holder died) and handles
// a job, and a deployment onto a survivor runs. Then both restart and the mesh converges:
// five alive, every key stream with all its replicas current, and the restarted nodes'
// audit logs hold every event acknowledged while they were down.
func TestIntegration_FiveLoseTwo(t *testing.T) {
	bed := openFaultBed(t, 5)
	for _, stream := range []string{registryStream, vaultStream, manifest.EventsStreamName, seatStream} {
		bed.loseTwo(t, bed.pairHitting(t, stream, ""))
	}
}

// TestIntegration_SevenLoseTwo: a mesh of seven loses two servers by kill -9, in turn: the
// leaders of the registry and of the vault; the leaders of EVENTS and of the seat's queue;
// the JetStream meta leader and the leader of the seat leases. Each pair falls back to
// another replica of the first stream when one node leads both. Throughout, the mesh works
// as in TestIntegration_FiveLoseTwo, and it converges after each pair restarts.
func TestIntegration_SevenLoseTwo(t *testing.T) {
	bed := openFaultBed(t, 7)
	bed.loseTwo(t, bed.pairHitting(t, registryStream, vaultStream))
	bed.loseTwo(t, bed.pairHitting(t, manifest.EventsStreamName, seatStream))
	bed.loseTwo(t, bed.pairHitting(t, "", leasesStream)) // "": the meta leader
}

// faultBed is a formed mesh with the modules the fault rounds drive: worker declares the
// seat and has an instance connected to every node; shop emits, uses the seat and owns a
// secret, and has a client on every node; runner is an artifact to deploy.
type faultBed struct {
	nodes   []*meshNode
	op      string // the operator's seed
	shop    string // shop's seed
	secret  string // the value of shop's secret k1
	workers []*sdk.Client
	shops   []*sdk.Client
	round   int

	mu      sync.Mutex
	acked   []string        // the IDs of shop's acknowledged events
	handled map[string]bool // the IDs of the jobs a worker instance handled
}

// openFaultBed forms a mesh of n servers on fixed client ports (a client of a killed node
// reconnects to it when it restarts), registers the bed's modules and connects them.
func openFaultBed(t *testing.T, n int) *faultBed {
	t.Helper()
	// At info, a node's host says what it did with each declaration: what a slow or failed
	// deploy's report quotes (with MESHNODE_TEST_LOG, everything at debug).
	level := "info"
	if os.Getenv("MESHNODE_TEST_LOG") != "" {
		level = "debug"
	}
	nodes, _, _ := formMesh(t, n, func(int) []string { return []string{"--client-addr", testbed.FreeAddr(t), "--log-level", level} })
	b := &faultBed{nodes: nodes, op: filepath.Join(nodes[0].dir, "operator.nk"), handled: map[string]bool{}}
	a := nodes[0].dir
	worker := registerModule(t, a, "module: worker\nrequires: [mesh-bus]\nseats:\n  "+faultSeat+": {scope: mesh, retain: 1h, accepts: [run]}\n", "--creds", b.op)
	b.shop = registerModule(t, a, "module: shop\nrequires: [mesh-bus]\nemits: [sold]\nuses: ["+faultSeat+"]\nsecrets: [k1]\n", "--creds", b.op)
	if r := meshnode(t, nil, "vault", "mint", "k1", "--owner", "shop", "--data-dir", a); r.code != 0 {
		t.Fatalf("vault mint: exit %d %s", r.code, r.stderr)
	}
	r := meshnode(t, nil, "vault", "fetch", "k1", "--owner", "shop", "--data-dir", a)
	if r.code != 0 || r.stdout == "" {
		t.Fatalf("vault fetch: exit %d %s", r.code, r.stderr)
	}
	b.secret = r.stdout
	work := t.TempDir()
	runner := filepath.Join(work, "runner.yaml")
	script := filepath.Join(work, "runner.sh")
	os.WriteFile(runner, []byte("module: runner\nrequires: [mesh-bus]\n"), 0o600)
	os.WriteFile(script, []byte("#!/bin/sh\necho \"hello from $MESH_NODE\"\nexec sleep 600\n"), 0o755)
	if r := meshnode(t, nil, "module", "register", runner, "--creds-out", runner+".nk", "--data-dir", a); r.code != 0 {
		t.Fatalf("register runner: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, "artifact", "put", "runner", script, "--version", "1", "--data-dir", a); r.code != 0 {
		t.Fatalf("artifact put: exit %d %s", r.code, r.stderr)
	}
	for _, n := range nodes {
		w := connectModule(t, n.p.clientURL, worker)
		if err := w.Accept("run", func(_ context.Context, j sdk.Job) error {
			b.mu.Lock()
			b.handled[j.ID] = true
			b.mu.Unlock()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		b.workers = append(b.workers, w)
		b.shops = append(b.shops, connectModule(t, n.p.clientURL, b.shop))
	}
	b.seatWorks(t, nil, 0)
	for _, s := range keyStreams {
		p := b.placement(t, nodes[0], s)
		t.Logf("%s: %d replicas, leader %s, followers %v", s, p.replicas, p.leader, p.followers)
	}
	return b
}

// connectModule connects the module with seed to the node at url, retrying while the node
// settles.
func connectModule(t *testing.T, url, seed string) *sdk.Client {
	t.Helper()
	var c *sdk.Client
	retryUntil(t, 30*time.Second, func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err = sdk.Connect(ctx, url, seed)
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// streamPlacement is where a stream's replicas are, as its leader reports them.
type streamPlacement struct {
	replicas  int // configured
	leader    string
	followers []string
	lagging   []string // followers not current, or offline
}

// placement asks the node n for stream's placement (as the operator), retrying while the
// stream has no leader.
func (b *faultBed) placement(t *testing.T, n *meshNode, stream string) streamPlacement {
	t.Helper()
	var p streamPlacement
	retryUntil(t, time.Minute, func() (err error) {
		p, err = b.queryPlacement(n, stream)
		return err
	})
	return p
}

// queryPlacement is one ask of placement.
func (b *faultBed) queryPlacement(n *meshNode, stream string) (streamPlacement, error) {
	nkey, err := nats.NkeyOptionFromSeed(b.op)
	if err != nil {
		return streamPlacement{}, err
	}
	nc, err := nats.Connect(n.p.clientURL, nkey, nats.CustomInboxPrefix(manifest.OperatorInbox), nats.NoReconnect())
	if err != nil {
		return streamPlacement{}, fmt.Errorf("connect to %s: %w", n.name, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return streamPlacement{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return streamPlacement{}, fmt.Errorf("stream %s through %s: %w", stream, n.name, err)
	}
	info := s.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return streamPlacement{}, fmt.Errorf("stream %s has no leader", stream)
	}
	p := streamPlacement{replicas: info.Config.Replicas, leader: info.Cluster.Leader}
	for _, r := range info.Cluster.Replicas {
		p.followers = append(p.followers, r.Name)
		if !r.Current || r.Offline {
			p.lagging = append(p.lagging, r.Name)
		}
	}
	return p, nil
}

// metaLeader is the JetStream meta leader, as the members verb on n reports it.
func metaLeader(t *testing.T, n *meshNode) string {
	t.Helper()
	var leader string
	retryUntil(t, time.Minute, func() error {
		st, err := memberStates(t, n.dir)
		if err != nil {
			return err
		}
		for name, s := range st {
			if strings.HasSuffix(s, "/leader") {
				leader = name
				return nil
			}
		}
		return fmt.Errorf("no JetStream meta leader among %v", st)
	})
	return leader
}

// pairHitting names the two servers to kill: the leader of first ("": the meta leader) and
// the leader of second; when second is "" or led by the same server, a follower of first
// (one that leads another key stream if there is one, to hit more leaders at once).
func (b *faultBed) pairHitting(t *testing.T, first, second string) [2]*meshNode {
	t.Helper()
	ask := b.nodes[0]
	leaderOf := func(stream string) (string, []string) {
		if stream == "" {
			return metaLeader(t, ask), nil
		}
		p := b.placement(t, ask, stream)
		return p.leader, p.followers
	}
	one, followers := leaderOf(first)
	two := ""
	if second != "" {
		two, _ = leaderOf(second)
	}
	if two == one || two == "" {
		candidates := followers
		if first == "" { // the meta leader: any other server
			candidates = nil
			for _, n := range b.nodes {
				candidates = append(candidates, n.name)
			}
		}
		leaders := map[string]bool{}
		for _, s := range keyStreams {
			leaders[b.placement(t, ask, s).leader] = true
		}
		two = ""
		for _, c := range candidates {
			if c != one && (two == "" || leaders[c] && !leaders[two]) {
				two = c
			}
		}
	}
	if two == "" || two == one {
		t.Fatalf("no second server to kill beside %s (stream %q's followers %v)", one, first, followers)
	}
	var pair [2]*meshNode
	for _, n := range b.nodes {
		switch n.name {
		case one:
			pair[0] = n
		case two:
			pair[1] = n
		}
	}
	if pair[0] == nil || pair[1] == nil {
		t.Fatalf("servers %s and %s are not the bed's nodes", one, two)
	}
	return pair
}

// loseTwo kills the pair with SIGKILL, checks that the survivors keep working, restarts the
// pair and waits for the mesh to converge.
func (b *faultBed) loseTwo(t *testing.T, pair [2]*meshNode) {
	t.Helper()
	b.round++
	var survivors []*meshNode
	for _, n := range b.nodes {
		if n != pair[0] && n != pair[1] {
			survivors = append(survivors, n)
		}
	}
	holder, epoch := b.holder()
	t.Logf("round %d: kill -9 %s and %s (seat held on %s, epoch %d)", b.round, pair[0].name, pair[1].name, b.nodeOf(holder), epoch)
	killed := time.Now()
	for _, n := range pair {
		n.p.cmd.Process.Kill()
		<-n.p.done
	}
	through := survivors[b.round%len(survivors)]
	b.survivorsWork(t, through, survivors, pair, holder, epoch)
	t.Logf("round %d: with %s and %s down, everything worked through %s within %s", b.round, pair[0].name, pair[1].name, through.name, time.Since(killed).Round(time.Millisecond))

	restarted := time.Now()
	for _, n := range pair {
		n.p = launch(t, "run", n.flags...)
	}
	for _, n := range pair {
		n.p.awaitReady(t, 2*time.Minute)
	}
	b.converge(t, pair)
	t.Logf("round %d: %s and %s restarted; the mesh converged in %s", b.round, pair[0].name, pair[1].name, time.Since(restarted).Round(time.Millisecond))
}

// survivorsWork checks each path a module or the operator takes, through the node through,
// while the pair is down.
func (b *faultBed) survivorsWork(t *testing.T, through *meshNode, survivors []*meshNode, pair [2]*meshNode, holder int, epoch uint64) {
	t.Helper()
	// How long each path took to work again (a figure for the report, not a bound).
	var took []string
	mark := time.Now()
	step := func(what string) {
		took = append(took, fmt.Sprintf("%s %s", what, time.Since(mark).Round(time.Millisecond)))
		mark = time.Now()
	}
	defer func() { t.Logf("round %d: %s", b.round, strings.Join(took, ", ")) }()
	// Registration (the controller's seat, the registry's bucket).
	name := fmt.Sprintf("late%d", b.round)
	retryUntil(t, time.Minute, func() error {
		path := filepath.Join(t.TempDir(), name+".yaml")
		os.WriteFile(path, []byte("module: "+name+"\nrequires: [mesh-bus]\n"), 0o600)
		r := meshnode(t, nil, "module", "register", path, "--creds-out", path+".nk", "--data-dir", through.dir, "--creds", b.op)
		if r.code != 0 {
			return fmt.Errorf("register %s through %s: exit %d %s", name, through.name, r.code, r.stderr)
		}
		return nil
	})
	step("register")
	// A secret, fetched as its module.
	retryUntil(t, time.Minute, func() error {
		r := meshnode(t, nil, "vault", "fetch", "k1", "--data-dir", through.dir, "--creds", b.shop)
		if r.code != 0 || r.stdout != b.secret {
			return fmt.Errorf("vault fetch through %s: exit %d %q %s", through.name, r.code, r.stdout, r.stderr)
		}
		return nil
	})
	step("vault fetch")
	// An event, acknowledged and in every survivor's audit log.
	shop := b.shops[slices.Index(b.nodes, through)]
	retryUntil(t, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		id, err := shop.Emit(ctx, "sold", map[string]int{"round": b.round})
		if err != nil {
			return fmt.Errorf("emit through %s: %w", through.name, err)
		}
		b.mu.Lock()
		b.acked = append(b.acked, id)
		b.mu.Unlock()
		return nil
	})
	step("emit")
	for _, n := range survivors {
		b.audited(t, n)
	}
	step("audited on every survivor")
	// The seat, on a survivor: a new holder under a higher epoch if its holder's node died.
	var dead []int
	for _, n := range pair {
		dead = append(dead, slices.Index(b.nodes, n))
	}
	if slices.Contains(dead, holder) {
		b.seatWorks(t, dead, epoch)
	} else {
		b.seatWorks(t, dead, 0)
	}
	h, e := b.holder()
	step(fmt.Sprintf("seat held on %s (epoch %d) and a job handled", b.nodeOf(h), e))
	// A deployment onto the survivor, moved off the node it ran on: one try, since the
	// controller has just answered a registration. --wait stays inside the 30 s a meshnode
	// command may take here, so a deploy that does not run in time says why.
	r := meshnode(t, nil, "deploy", "runner", "--version", "1", "--nodes", through.name, "--wait", "25s", "--data-dir", through.dir, "--creds", b.op)
	if r.code != 0 || !strings.Contains(r.stdout, through.name+": running (1 of 1)") {
		ps := meshnode(t, nil, "ps", "--json", "--data-dir", through.dir, "--creds", b.op)
		// Where the controller's answer went (run 32: none within 30 s, from a controller
		// that had answered a registration seconds before), on whichever survivor holds it.
		var controller []string
		for _, n := range survivors {
			controller = append(controller, fmt.Sprintf("%s's controller and seats say:\n%s", n.name, componentLog(n.p.stderr.String(), 25, "component=controller", "component=seats")))
		}
		t.Fatalf("round %d: deploy runner onto %s: exit %d %s %s\nps then: %s %s\n%s's log ends:\n%s\n%s", b.round, through.name, r.code, r.stdout, r.stderr, ps.stdout, ps.stderr,
			through.name, hostLog(through.p.stderr.String(), 40), strings.Join(controller, "\n"))
	}
	if took := time.Since(mark); took > 5*time.Second {
		// And where the controller waited, if it did: its warnings (a wait for its lock, a
		// slow request, a declaration that failed), on whichever survivor holds it.
		var controller []string
		for _, n := range survivors {
			var warned []string
			for line := range strings.Lines(componentLog(n.p.stderr.String(), 200, "component=controller")) {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
					warned = append(warned, strings.TrimRight(line, "\n"))
				}
			}
			if len(warned) > 0 {
				controller = append(controller, fmt.Sprintf("%s's controller warned:\n%s", n.name, strings.Join(warned[max(0, len(warned)-10):], "\n")))
			}
		}
		t.Logf("round %d: the deploy onto %s, asked at %s, took %s; its host said:\n%s\n%s", b.round, through.name, mark.UTC().Format(time.RFC3339Nano),
			took.Round(time.Millisecond), hostLog(through.p.stderr.String(), 15), strings.Join(controller, "\n"))
	}
	step("deploy")
}

// holder is the index of the worker instance (and so of the node) holding the seat, and its
// epoch; -1 if none does.
func (b *faultBed) holder() (int, uint64) {
	for i, w := range b.workers {
		if ok, epoch := w.Holding(faultSeat); ok {
			return i, epoch
		}
	}
	return -1, 0
}

// nodeOf names the node of worker instance i.
func (b *faultBed) nodeOf(i int) string {
	if i < 0 {
		return "no node"
	}
	return b.nodes[i].name
}

// seatWorks waits until an instance on a node not in dead holds the seat, above epoch, and
// then a job submitted through shop on that node is handled.
func (b *faultBed) seatWorks(t *testing.T, dead []int, above uint64) {
	t.Helper()
	var holder int
	retryUntil(t, time.Minute, func() error {
		for i, w := range b.workers {
			if ok, epoch := w.Holding(faultSeat); ok && !slices.Contains(dead, i) && epoch > above {
				holder = i
				return nil
			}
		}
		h, epoch := b.holder()
		return fmt.Errorf("seat %s: no instance on a live node holds it above epoch %d (held on %s, epoch %d)", faultSeat, above, b.nodeOf(h), epoch)
	})
	var id string
	retryUntil(t, time.Minute, func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		id, err = b.shops[holder].Submit(ctx, faultSeat, "run", map[string]int{"round": b.round})
		return err
	})
	retryUntil(t, time.Minute, func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		if !b.handled[id] {
			return fmt.Errorf("job %s on seat %s not handled (held on %s)", id, faultSeat, b.nodeOf(holder))
		}
		return nil
	})
}

// audited waits until the audit log of n holds every event of shop's acknowledged so far,
// each once.
func (b *faultBed) audited(t *testing.T, n *meshNode) {
	t.Helper()
	b.mu.Lock()
	acked := slices.Clone(b.acked)
	b.mu.Unlock()
	retryUntil(t, 2*time.Minute, func() error {
		ids, err := queryAuditIDs(t, n.dir, b.op, "shop")
		if err != nil {
			return err
		}
		for _, id := range acked {
			if ids[id] != 1 {
				return fmt.Errorf("%s's audit log has event %s %d times, want once", n.name, id, ids[id])
			}
		}
		return nil
	})
}

// converge waits until every server is alive, every key stream has all its replicas
// current, the restarted pair's audit logs hold every acknowledged event, every client is
// connected again and every host has applied its declaration.
func (b *faultBed) converge(t *testing.T, pair [2]*meshNode) {
	t.Helper()
	retryUntil(t, 2*time.Minute, func() error {
		st, err := memberStates(t, b.nodes[0].dir)
		if err != nil {
			return err
		}
		alive := 0
		for _, s := range st {
			if strings.HasPrefix(s, "alive/") {
				alive++
			}
		}
		if alive != len(b.nodes) {
			return fmt.Errorf("%d of %d servers alive: %v", alive, len(b.nodes), st)
		}
		return nil
	})
	for _, s := range keyStreams {
		retryUntil(t, 2*time.Minute, func() error {
			p, err := b.queryPlacement(pair[0], s)
			if err != nil {
				return err
			}
			if len(p.followers)+1 != p.replicas || len(p.lagging) > 0 {
				return fmt.Errorf("stream %s: %d replicas configured, leader %s, followers %v, not current %v", s, p.replicas, p.leader, p.followers, p.lagging)
			}
			return nil
		})
	}
	for _, n := range pair {
		b.audited(t, n)
	}
	retryUntil(t, time.Minute, b.clientsBack)
	// Every host has applied the declaration published for it: a restarted node follows
	// the declarations again.
	retryUntil(t, time.Minute, func() error {
		r := meshnode(t, nil, "ps", "--json", "--data-dir", b.nodes[0].dir, "--creds", b.op)
		if r.code != 0 {
			return fmt.Errorf("ps: exit %d %s", r.code, r.stderr)
		}
		for line := range strings.Lines(r.stdout) {
			var p struct {
				Module, Node, State string
				Revision, Declared  uint64
			}
			if err := json.Unmarshal([]byte(line), &p); err != nil {
				return fmt.Errorf("ps --json: %w: %s", err, line)
			}
			if p.Revision < p.Declared {
				return fmt.Errorf("%s's host has applied revision %d of its declarations, %d is declared (%s is %s)", p.Node, p.Revision, p.Declared, p.Module, p.State)
			}
		}
		return nil
	})
}

// clientsBack reports the modules' clients not connected again.
func (b *faultBed) clientsBack() error {
	var errs []error
	for i, n := range b.nodes {
		for _, c := range []*sdk.Client{b.workers[i], b.shops[i]} {
			if !c.Conn().IsConnected() {
				errs = append(errs, errors.New(c.Module()+"'s client of "+n.name+" is not connected"))
			}
		}
	}
	return errors.Join(errs...)
}

// hostLog is the last n lines of a node's log about its declaration (its host's, at info, the
// level the bed's nodes log at).
// componentLog is the last n lines of a node's log from any of components.
func componentLog(log string, n int, components ...string) string {
	var lines []string
	for line := range strings.Lines(log) {
		if slices.ContainsFunc(components, func(c string) bool { return strings.Contains(line, c) }) {
			lines = append(lines, strings.TrimRight(line, "\n"))
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func hostLog(log string, n int) string {
	var lines []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, "component=host") || strings.Contains(line, "declaration") {
			lines = append(lines, strings.TrimRight(line, "\n"))
		}
	}
	if len(lines) == 0 {
		// None at this log level (a round in which the node's host said nothing): the end of
		// the node's own log instead, nats-server's lines left out.
		for line := range strings.Lines(log) {
			if !strings.Contains(line, "component=nats") {
				lines = append(lines, strings.TrimRight(line, "\n"))
			}
		}
		return "(no host or declaration lines; the end of its log)\n" + strings.Join(lines[max(0, len(lines)-n):], "\n")
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
