package node

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
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/formats"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/internal/lifecycle"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/membership"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/streammove"
	"github.com/nats-io/nats.go"
)

// A single node's JetStream is standalone, and a standalone server restarted clustered
// loses its streams (nats-server#5467, DESIGN §6): growing one node into a mesh is a
// migration. `meshnode grow --expect N` puts the node in the waiting phase: it gossips, and
// the vault's join tokens carry the growth, so the joining nodes form the mesh with it and
// then wait for its state. Once N servers are alive the node restarts (Run returns
// ErrRestart) and, before anything connects, snapshots every stream (KV buckets and object
// stores are streams) to <data-dir>/grow, moves its standalone store aside, starts clustered
// with the others, restores each stream, checks its message count and sequences against
// the snapshot, and scales it to 3 replicas — the mesh's registry last, which is what the
// joining nodes wait for. Each phase is recorded in the foundation before the next begins:
// a node interrupted while snapshotting starts over from its untouched store; one
// interrupted while restoring resumes, keeping the streams already restored whole. Until
// every stream is restored the node's clients find its port closed (the bus listens on a
// free loopback port), and then it starts its bus again on the node's port.

// The phases of growing (genesis.Foundation.GrowPhase).
const (
	growWaiting   = "waiting"   // gossiping, standalone, until the other servers are alive
	growSnapshot  = "snapshot"  // at the next start: snapshot every stream, move the store aside
	growRestoring = "restoring" // clustered: restore and scale every stream
)

// growDir holds the snapshots and the standalone store while the node grows.
const growDir = "grow"

// ErrRestart means Run ended so that the node is opened again: it grows (see grow.go).
var ErrRestart = errors.New("the node restarts to go on growing")

// grower is a single node's growth into a mesh while it waits for the other servers: the
// gossip the joining nodes find it by, and the loop that counts its members and restarts
// the node once every server is alive. It opens once (open); close ends the count, waits
// for it and stops the gossip.
type grower struct {
	// mu serialises the growth's steps (the grow tool's requests, the count of members) and
	// guards the foundation's GrowTo and GrowPhase, which they change.
	mu      sync.Mutex
	started bool                   // open ran or runs: the growth's gossip is this node's
	gossip  *membership.Membership // nil unless open and not closed
	work    *lifecycle.Group       // the count of gossip's members; made by group

	progress atomic.Pointer[string] // for status and /readyz
	restart  atomic.Bool            // Run ends with ErrRestart
}

// group is the grower's work, made on first use (under mu): by open, or by a close that
// comes first, so that open starts nothing after it.
func (g *grower) group() *lifecycle.Group {
	if g.work == nil {
		g.work = lifecycle.NewGroup(context.Background())
	}
	return g.work
}

// open starts the growth's gossip, once (a grow request may come while the start begins it,
// or again; a later call does nothing, unless the first one's start failed): start opens it,
// with kick for its OnChange, and count runs at once and after each kick until close.
func (g *grower) open(start func(kick func()) (*membership.Membership, error), count func()) error {
	g.mu.Lock()
	started := g.started
	g.started = true
	g.mu.Unlock()
	if started {
		return nil
	}
	kicks := make(chan struct{}, 1)
	m, err := start(func() {
		select {
		case kicks <- struct{}{}:
		default:
		}
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.started = false
		return err
	}
	// The gossip is the grower's in the same hold of mu as its count starts: a close that
	// finds no count to wait for finds no gossip either.
	counting := g.group().Go(func(ctx context.Context) {
		for {
			count()
			select {
			case <-kicks:
			case <-ctx.Done():
				return
			}
		}
	})
	if !counting {
		// Closed while the gossip opened.
		return errors.Join(errors.New("the node is stopping: its growth goes on when it starts again"), m.Stop(time.Second))
	}
	g.gossip = m
	return nil
}

// close ends the count of members, waits for it, and stops the gossip.
func (g *grower) close() error {
	g.mu.Lock()
	work := g.group()
	g.mu.Unlock()
	work.Close() // not under mu: the count takes it
	g.mu.Lock()
	m := g.gossip
	g.gossip = nil
	g.mu.Unlock()
	if m == nil {
		return nil
	}
	return m.Stop(time.Second)
}

// serveGrow answers the single node's grow tool.
func (n *Node) serveGrow() (*nats.Subscription, error) {
	return n.resp.nc.Subscribe(manifest.NodeToolSubject(n.id.Name, api.NodeToolGrow), func(m *nats.Msg) {
		var req api.GrowRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			respondCluster(m, errors.New("the request is not JSON"))
			return
		}
		respondCluster(m, n.beginGrow(req.Expect))
	})
}

// beginGrow puts the single node in the waiting phase of growing into a mesh of expect
// servers, and starts its gossip.
func (n *Node) beginGrow(expect int) error {
	if err := n.keepGrowth(expect); err != nil {
		return err
	}
	n.log.Info("growing into a mesh: waiting for the other servers to join", "expect", expect, "gossip_addr", n.cfg.GossipAddr, "cluster_addr", n.cfg.ClusterAddr)
	return n.gossipToGrow()
}

// keepGrowth records the waiting phase of growing into expect servers.
func (n *Node) keepGrowth(expect int) error {
	n.grower.mu.Lock()
	defer n.grower.mu.Unlock()
	switch {
	case n.found.Expect >= 3:
		return fmt.Errorf("mesh %s already has %d servers: add one with `meshnode token create` and `meshnode join`", n.id.MeshID, n.found.Expect)
	case expect < 3:
		return fmt.Errorf("--expect %d: a mesh has 3 or more servers (two cannot lose one, and one is what this node is)", expect)
	case n.found.GrowTo > 0 && n.found.GrowTo != expect:
		return fmt.Errorf("this node already grows into %d servers; run `meshnode grow --expect %d` for its token again", n.found.GrowTo, n.found.GrowTo)
	case n.found.GrowTo > 0:
		return nil // asked again: the same growth, a new token
	}
	if _, err := advertised(n.cfg, nil); err != nil {
		return err
	}
	f := *n.found
	f.GrowTo, f.GrowPhase = expect, growWaiting
	if err := genesis.New(n.db).Keep(&f); err != nil {
		return fmt.Errorf("keep the growth: %w", err)
	}
	n.found.GrowTo, n.found.GrowPhase = expect, growWaiting
	return nil
}

// gossipToGrow starts the waiting node's gossip: the joining nodes find it with the
// enrolment's seeds; once all are alive the node restarts to migrate.
func (n *Node) gossipToGrow() error {
	return n.grower.open(func(kick func()) (*membership.Membership, error) {
		adv, err := advertised(n.cfg, nil)
		if err != nil {
			return nil, err
		}
		if n.cfg.Advertise == "" {
			adv.gossip = ""
		}
		m, err := membership.Open(membership.Config{
			Meta:          membership.Meta{Name: n.id.Name, MeshID: n.id.MeshID, Route: "nats-route://" + adv.route, Client: "nats://" + adv.client, Version: formats.MeshnodeVersion()},
			BindAddr:      n.cfg.GossipAddr,
			AdvertiseAddr: adv.gossip,
			GossipKey:     n.found.GossipKey,
			Log:           n.log,
			// Called under memberlist's lock, which Members takes: the count is made elsewhere.
			OnChange: func(membership.Member) { kick() },
		})
		if err != nil {
			return nil, fmt.Errorf("gossip: %w; set --gossip-addr", err)
		}
		n.setGrowing(fmt.Sprintf("growing into %d servers: waiting for %d more to join", n.found.GrowTo, n.found.GrowTo-1))
		return m, nil
	}, n.growMembersChanged)
}

// growTo is the servers the single node grows into, 0 when it is not growing.
func (n *Node) growTo() int {
	n.grower.mu.Lock()
	defer n.grower.mu.Unlock()
	return n.found.GrowTo
}

// growMembers is the waiting node's gossip, nil when it is not waiting to grow.
func (n *Node) growMembers() *membership.Membership {
	n.grower.mu.Lock()
	defer n.grower.mu.Unlock()
	return n.grower.gossip
}

// growMembersChanged restarts the waiting node once every server of the mesh it grows into
// is alive, remembering their gossip addresses to find them again.
func (n *Node) growMembersChanged() {
	n.grower.mu.Lock()
	defer n.grower.mu.Unlock()
	if n.grower.gossip == nil || n.found.GrowPhase != growWaiting {
		return
	}
	var alive []membership.Member
	for _, x := range n.grower.gossip.Members() {
		if x.State == "alive" {
			alive = append(alive, x)
		}
	}
	if len(alive) < n.found.GrowTo {
		n.setGrowing(fmt.Sprintf("growing into %d servers: waiting for %d more to join: have %s", n.found.GrowTo, n.found.GrowTo-len(alive), strings.Join(names(alive), ", ")))
		return
	}
	f := *n.found
	f.GrowPhase = growSnapshot
	if f.GrowTo == 0 || n.grower.restart.Load() {
		return
	}
	for _, x := range alive {
		if x.Name != n.id.Name && !slices.Contains(f.Seeds, x.Addr) {
			f.Seeds = append(f.Seeds, x.Addr)
		}
	}
	if err := genesis.New(n.db).Keep(&f); err != nil {
		n.log.Error("keep the growth's next phase; still waiting", "err", err)
		return
	}
	// The next start reads the phase from the store: n.found stays as it is.
	n.log.Info("every server of the mesh is here: restarting to move this node's streams into the mesh", "members", names(alive))
	n.grower.restart.Store(true)
	n.requestStop()
}

// setGrowing is the growth's progress, for status and /readyz.
func (n *Node) setGrowing(progress string) {
	n.grower.progress.Store(&progress)
}

// Growing is the node's growth into a mesh, "" when it is not growing.
func (n *Node) Growing() string {
	if p := n.grower.progress.Load(); p != nil {
		return *p
	}
	return ""
}

// grow runs the migration phases at start (see the top of this file) and leaves the node's
// bus started, clustered, with every stream restored.
func (n *Node) grow(octx context.Context) error {
	dir := filepath.Join(n.cfg.DataDir, growDir)
	store, aside := filepath.Join(n.cfg.DataDir, datadir.JetStreamDir), filepath.Join(dir, datadir.JetStreamDir)
	if n.found.GrowPhase == growSnapshot {
		// Start over from the standalone store: put it back if a move was not recorded.
		if _, err := os.Stat(aside); err == nil {
			if err := os.RemoveAll(store); err != nil {
				return err
			}
			if err := os.Rename(aside, store); err != nil {
				return err
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		n.setPhase("growing: taking a snapshot of every stream")
		// On a free loopback port: nothing but this node connects while it snapshots.
		if err := n.startBus(octx, nil, "127.0.0.1:0"); err != nil {
			return err
		}
		err := streammove.SnapshotAll(octx, n.bus.Conn(), dir, "KV_"+registry.Bucket, n.log)
		n.bus.Close()
		n.bus = nil
		if err != nil {
			return fmt.Errorf("grow: snapshot: %w; the store is untouched, and the next start tries again", err)
		}
		if err := os.Rename(store, aside); err != nil {
			return err
		}
		f := *n.found
		f.GrowPhase, f.Expect, f.Formed = growRestoring, f.GrowTo, false
		if err := genesis.New(n.db).Keep(&f); err != nil {
			return err
		}
		*n.found = f
	}
	n.setPhase("growing: forming the mesh with the other servers")
	cluster, err := n.form(octx)
	if err != nil {
		return err
	}
	// Clients on a free loopback port while the streams are restored (minutes, for a large
	// store): the node cannot tell modules apart before it reads the restored registry, and
	// on its own port it would hold each connect and then refuse it; a closed port is what
	// every client waits out. The bus starts again on the node's port once restored. Its
	// peers must not hand that port to their clients.
	restoring := *cluster
	restoring.NoAdvertise = true
	if err := n.startBus(octx, &restoring, "127.0.0.1:0"); err != nil {
		return err
	}
	// Every server a JetStream peer first: a stream is placed, and scaled, only on peers
	// the meta group knows.
	n.setPhase("growing: waiting for every server to be a JetStream peer")
	for {
		current := 0
		for _, ok := range n.bus.Peers() {
			if ok {
				current++
			}
		}
		if current >= n.found.Expect && n.bus.MetaLeader() != "" {
			break
		}
		select {
		case <-octx.Done():
			return fmt.Errorf("grow: waiting for %d JetStream peers: %w", n.found.Expect, octx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	man, err := streammove.ReadManifest(dir)
	if err != nil {
		return fmt.Errorf("grow: the snapshots' manifest: %w; the standalone store is in %s", err, aside)
	}
	for _, s := range man.Streams {
		n.setPhase("growing: restoring " + s.Config.Name)
		// The mesh's registry last (SnapshotAll's order): the joining nodes wait for it.
		if _, err := streammove.Restore(octx, n.log, n.bus.Conn(), n.bus.JetStream(), dir, s, n.replicas()); err != nil {
			return fmt.Errorf("grow: restore %s: %w; the next start goes on (the standalone store is in %s)", s.Config.Name, err, aside)
		}
		n.log.Info("restored into the mesh", "stream", s.Config.Name, "messages", s.State.Msgs, "last_seq", s.State.LastSeq, "replicas", n.replicas())
	}
	f := *n.found
	f.GrowTo, f.GrowPhase = 0, ""
	if err := genesis.New(n.db).Keep(&f); err != nil {
		return err
	}
	*n.found = f
	if err := os.RemoveAll(dir); err != nil {
		n.log.Warn("remove the snapshots and the standalone store", "dir", dir, "err", err)
	}
	n.log.Info("grown into a mesh", "mesh_id", n.id.MeshID, "members", n.found.Members, "streams", len(man.Streams))
	n.setPhase("grown into a mesh: starting the bus on the node's client port")
	n.bus.Close()
	n.bus = nil
	return n.startBus(octx, cluster, n.cfg.ClientAddr)
}

// awaitGrowth holds a node that joined a growing single node until that node has restored
// the mesh's state: the registry's bucket, restored last, at the mesh's replicas.
func (n *Node) awaitGrowth(ctx context.Context) error {
	n.setPhase("waiting for the growing (or restoring) node to bring the mesh's streams into the mesh")
	js := n.bus.JetStream()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := js.Stream(rctx, "KV_"+registry.Bucket)
		cancel()
		if err == nil && st.CachedInfo().Config.Replicas >= n.replicas() && st.CachedInfo().Config.Metadata[streammove.RestoringMeta] == "" {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the growing (or restoring) node to bring the mesh's streams: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	f := *n.found
	f.AwaitGrowth = false
	if err := genesis.New(n.db).Keep(&f); err != nil {
		return err
	}
	*n.found = f
	return nil
}
