package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/formats"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/internal/lifecycle"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/membership"
	"github.com/nats-io/nats.go"
	bolt "go.etcd.io/bbolt"
)

// clusterPart is this server's place in its mesh.
type clusterPart struct {
	members   *membership.Membership
	formats   *formats.Watcher          // the shared formats' versions the servers agree on
	routeOf   map[string]string         // member → host:port of the route this node was started with (form)
	work      *lifecycle.Group          // a leave or removal in progress: Close ends and waits for it
	eventConn atomic.Pointer[nats.Conn] // set while open: gossip changes become node events on it
	left      atomic.Bool               // the node left its mesh
}

// ErrLeft means the data dir's node left its mesh: it cannot run again under that identity.
var ErrLeft = errors.New("this node left its mesh")

// clusterTimeout bounds a leave or a removal: a meta leader step-down and a peer removal.
const clusterTimeout = 30 * time.Second

// serveCluster answers one of the node's cluster tools (api.NodeToolLeave, api.NodeToolRemove).
func (n *Node) serveCluster(tool string) (*nats.Subscription, error) {
	return n.resp.nc.Subscribe(manifest.NodeToolSubject(n.id.Name, tool), func(m *nats.Msg) { n.clusterTool(tool, m) })
}

func (n *Node) clusterTool(tool string, m *nats.Msg) {
	var req api.ClusterRequest
	if len(m.Data) > 0 && json.Unmarshal(m.Data, &req) != nil {
		respondCluster(m, errors.New("the request is not JSON"))
		return
	}
	// The work takes seconds: answer from a goroutine, not the connection's. Close waits
	// for it, after cancelling it; a request that comes while the node closes is not taken.
	started := n.mesh.work.Go(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
		defer cancel()
		if tool == api.NodeToolRemove {
			respondCluster(m, n.removeServer(ctx, req.Node))
			return
		}
		err := n.leave(ctx)
		if err != nil {
			err = fmt.Errorf("%w; run `meshnode leave` again (this node may already have handed its seats on and left the gossip), or stop it and run `meshnode node remove %s` on another node", err, n.id.Name)
		}
		respondCluster(m, err)
		if err == nil {
			n.mesh.left.Store(true)
			n.bus.Conn().Flush()
			n.requestStop()
		}
	})
	if !started {
		respondCluster(m, errors.New("the node is stopping: ask another node"))
	}
}

// A node reports another node's end under its own name, signed by itself: the other has
// no say in it (it is dead, or gone), and an event is genuine only from its subject's owner.
// The body's node names the one reported on.
const (
	eventMemberUnreachable = "member-unreachable" // gossip holds it dead (the controller's holder reports it)
	eventMemberRemoved     = "member-removed"     // `meshnode node remove` removed it
	eventFormatSwitched    = "format-switched"    // every server reads a shared format's newer version (formatSwitched)
)

// dropRoutesOfGone drops this node's configured route to a server that left the mesh or was
// removed from it, as the node events say: nats-server would retry it, and log it, for ever.
func (n *Node) dropRoutesOfGone() (*nats.Subscription, error) {
	return n.bus.Conn().Subscribe(manifest.NodeEventSubject("*", "*"), func(m *nats.Msg) {
		event := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		if event != "left" && event != eventMemberRemoved {
			return
		}
		var body struct{ Node string } // "node": encoding/json matches names regardless of case
		if json.Unmarshal(m.Data, &body) != nil || body.Node == "" || body.Node == n.id.Name {
			return
		}
		if event == "left" {
			n.mesh.members.Left(body.Node) // its goodbye over gossip may come after its end, or not at all
		}
		addr := n.mesh.routeOf[body.Node]
		if addr == "" {
			return // a server that joined after this one started: its route is its own
		}
		dropped, err := n.bus.DropRoute(addr)
		switch {
		case err != nil:
			n.log.Warn("keep retrying the route to a server that is gone", "peer", body.Node, "route", addr, "err", err)
		case dropped:
			n.log.Info("dropped the route to a server that is gone", "peer", body.Node, "route", addr, "why", event)
		}
	})
}

func respondCluster(m *nats.Msg, err error) {
	r := api.ClusterReply{OK: err == nil}
	if err != nil {
		r.Error = err.Error()
	}
	b, _ := json.Marshal(r)
	m.Respond(b)
}

// leave takes this node out of its mesh for good: it announces it, hands its seats on,
// says goodbye to the gossip, and has the JetStream meta leader remove it as a peer. The
// data dir then refuses to run (ErrLeft); the machine joins again with a fresh data dir and
// a new token.
func (n *Node) leave(ctx context.Context) error {
	if n.mesh.members == nil {
		return errors.New("a single node has no mesh to leave; stop it instead")
	}
	// The JetStream meta group's peers are the servers that count (the registry's mirror
	// can lag behind a removal).
	var others []string
	for name := range n.bus.Peers() {
		if name != n.id.Name {
			others = append(others, name)
		}
	}
	slices.Sort(others)
	if len(others) < 3 {
		return fmt.Errorf("leaving would leave %d servers (%s): the mesh's streams keep 3 replicas; add a node first (`meshnode token create`, then `meshnode join` on the new machine), or stop this one instead of leaving",
			len(others), strings.Join(others, ", "))
	}
	n.log.Info("leaving the mesh", "mesh_id", n.id.MeshID)
	// Stored (acked, asked again while EVENTS elects a leader) before anything changes: a
	// leave never announced is a gap in every audit log. One that fails can be run again.
	if err := n.storeNodeEvent(ctx, "left", map[string]any{"node": n.id.Name, "reason": "leave"}); err != nil {
		return fmt.Errorf("leave: announce it in EVENTS: %w", err)
	}
	n.seats.run.Retire(ctx)
	if err := n.mesh.members.Leave(5 * time.Second); err != nil {
		n.log.Warn("leave gossip", "err", err)
	}
	if err := n.stepDown(ctx); err != nil {
		return err
	}
	if err := jsretry.Request(ctx, func(ctx context.Context) error { return n.bus.RemovePeer(ctx, n.id.Name) }); err != nil && !errors.Is(err, embedbus.ErrNotPeer) {
		return fmt.Errorf("leave: %w", err)
	}
	if err := jsretry.Request(ctx, func(ctx context.Context) error { return n.reg.RemoveNode(ctx, n.id.Name) }); err != nil {
		n.log.Warn("forget this node's keys", "err", err)
	}
	return datadir.MarkNow(n.db, "left")
}

// stepDown hands the JetStream meta leadership to another server if this one has it: a
// leader does not remove itself.
func (n *Node) stepDown(ctx context.Context) error {
	for n.bus.MetaLeader() == n.id.Name {
		if err := n.bus.StepDown(ctx); err != nil {
			n.log.Debug("meta leader step-down", "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("leave: this node is still the JetStream meta leader: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// removeServer removes a dead server from the mesh: from the JetStream meta group (which
// never drops a peer by itself), and from the mesh's servers, and says so.
func (n *Node) removeServer(ctx context.Context, name string) error {
	switch {
	case n.mesh.members == nil:
		return errors.New("a single node has no other servers to remove")
	case name == "":
		return errors.New("name the server to remove")
	case name == n.id.Name:
		return fmt.Errorf("%s is this node: run `meshnode leave` on it instead", name)
	}
	if _, ok := n.reg.Node(name); !ok {
		return fmt.Errorf("mesh %s has no server named %s (servers: %s)", n.id.MeshID, name, strings.Join(n.reg.Nodes(), ", "))
	}
	for _, m := range n.mesh.members.Members() {
		if m.Name == name && (m.State == "alive" || m.State == "suspect") {
			return fmt.Errorf("%s is %s: stop it first (or run `meshnode leave` on it); only a dead server is removed", name, m.State)
		}
	}
	if err := jsretry.Request(ctx, func(ctx context.Context) error { return n.bus.RemovePeer(ctx, name) }); err != nil && !errors.Is(err, embedbus.ErrNotPeer) {
		return err
	}
	if err := jsretry.Request(ctx, func(ctx context.Context) error { return n.reg.RemoveNode(ctx, name) }); err != nil {
		return err
	}
	n.mesh.members.Forget(name)
	n.log.Info("server removed from the mesh", "server", name)
	n.storeNodeEvent(ctx, eventMemberRemoved, map[string]any{"node": name, "by": n.id.Name})
	return nil
}

// memberChanged turns gossip into node events: the holder of mesh-controller reports a
// server that stopped answering, so the mesh reports it once.
func (n *Node) memberChanged(m membership.Member) {
	if m.State != "dead" || n.mesh.eventConn.Load() == nil || m.Name == n.id.Name {
		return
	}
	if s := n.dir.seats.Load(); s == nil || s.heldEpoch(manifest.ControllerSeat) == 0 {
		return
	}
	n.log.Warn("a server stopped answering", "server", m.Name, "addr", m.Addr)
	// Stored off memberlist's goroutine (this runs under its locks), through an election of
	// EVENTS' leader: the server gone may have been it.
	n.mesh.work.Go(func(ctx context.Context) {
		n.storeNodeEvent(ctx, eventMemberUnreachable, map[string]any{"node": m.Name, "addr": m.Addr, "by": n.id.Name})
	})
}

// reportUnreachable reports every server gossip holds dead: this node has just become the
// holder of mesh-controller, and the previous holder may have died before it could.
func (n *Node) reportUnreachable() {
	if n.mesh.members == nil {
		return
	}
	for _, m := range n.mesh.members.Members() {
		n.memberChanged(m)
	}
}

// checkNotLeft refuses a data dir whose node left its mesh.
func checkNotLeft(db *bolt.DB, name string) error {
	if when := datadir.Value(db, "left"); when != "" {
		return fmt.Errorf("%w at %s: node %s is no longer a server of it; to join again, use a fresh --data-dir and a new token (`meshnode token create`)", ErrLeft, when, name)
	}
	return nil
}

// formats is this node's formats: the binary's, or the test's stand-in.
func (n *Node) formats() map[string]formats.Version {
	if n.Formats != nil {
		return n.Formats
	}
	return formats.All()
}

// formatSwitched records a shared format's agreed version changing. Every server that saw the
// older agreement publishes the node event format-switched under one Nats-Msg-Id, so the audit
// log has it once: the holder of mesh-controller alone would miss it when it is the server just
// upgraded (its first agreement is already the newer one) or its lease is still moving.
func (n *Node) formatSwitched(s formats.Switch) {
	if nc := n.mesh.eventConn.Load(); nc != nil {
		publishNodeEvent(nc, n.key, n.id.Name, eventFormatSwitched, map[string]any{"format": s.Format, "from": s.From, "to": s.To}, n.log,
			fmt.Sprintf("format-switched.%s.%d.%d", s.Format, s.From, s.To))
	}
}
