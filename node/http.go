package node

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/dashboard"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/formats"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/replication"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// front is the node's HTTP side: bound before the bus starts, answering with startHandler
// while the node opens and with the API and the dashboard once it is open.
type front struct {
	ln      net.Listener
	srv     *http.Server
	done    chan struct{} // closed when the server ends (serveEarly); err says how
	err     error
	handler atomic.Pointer[http.Handler] // what it answers with: startHandler, then the API
	phase   atomic.Pointer[string]       // why the node is not ready yet while it opens
	dash    *dashboard.Dashboard         // the operator's console, opened with the API
	certs   meshca.Later                 // the node's certificate, for HTTPS beyond loopback
}

// readyTimeout bounds the JetStream round trip behind /readyz.
const readyTimeout = 2 * time.Second

// serveEarly serves the HTTP listener from the moment it is bound: while the node opens —
// a founding node waiting for its peers, a restart waiting for a majority — /healthz says it
// lives and /readyz says, at once, why it is not ready. newHTTPServer swaps in the full API.
func (n *Node) serveEarly() {
	n.setPhase("starting")
	var h http.Handler = n.startHandler()
	n.web.handler.Store(&h)
	n.web.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*n.web.handler.Load()).ServeHTTP(w, r) })}
	n.web.done = make(chan struct{})
	srv, ln := n.web.srv, n.web.ln
	go func() {
		n.web.err = srv.Serve(ln)
		close(n.web.done)
	}()
}

// closeHTTP ends the HTTP server and waits for it; a second call finds it closed.
func (n *Node) closeHTTP() error {
	err := n.web.srv.Close()
	<-n.web.done
	return err
}

// setPhase records why the node is not ready yet ("" once it is open) and tells OnPhase.
func (n *Node) setPhase(phase string) {
	if p := n.web.phase.Load(); p != nil && *p == phase {
		return
	}
	n.web.phase.Store(&phase)
	if n.OnPhase != nil {
		n.OnPhase(phase)
	}
}

// alive answers /healthz: the process serves.
func alive(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
}

// startHandler answers while the node opens.
func (n *Node) startHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", alive)
	notReady := func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": *n.web.phase.Load()})
	}
	mux.HandleFunc("GET /readyz", notReady)
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, api.NodeStatus{Name: n.id.Name, MeshID: n.id.MeshID, Version: formats.MeshnodeVersion(), HTTPURL: n.HTTPURL(),
			ClusterAddr: n.cfg.ClusterAddr, GossipAddr: n.cfg.GossipAddr, Started: n.started,
			UptimeSeconds: time.Since(n.started).Seconds(), Reason: *n.web.phase.Load()})
	})
	return mux
}

func (n *Node) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", alive)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := n.ready(r.Context()); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": err.Error()})
			return
		}
		if g := n.Growing(); g != "" {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "growing": g})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, n.Status(r.Context()))
	})
	mux.HandleFunc("GET /v1/members", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, n.Members())
	})
	dash := n.web.dash.Handler()
	mux.Handle("GET /{$}", dash)
	mux.Handle("/ui/", dash)
	return mux
}

// openDashboard opens the operator's console on what the node has opened by now.
func (n *Node) openDashboard() *dashboard.Dashboard {
	return dashboard.Open(context.Background(), dashboard.Config{Node: n.id.Name, MeshID: n.id.MeshID, Mesh: dashboardMesh{n},
		Registry: n.reg, Audit: n.audit, Conn: n.bus.Conn(), JetStream: n.bus.JetStream(), Log: n.log, Sessions: dashboard.BoltSessions(n.db),
		Quotas: func() []api.QuotaUse { return n.quotaUse(n.reg.Names()) },
		Record: func(a dashboard.ConsoleAction) {
			publishNodeEvent(n.bus.Conn(), n.key, n.id.Name, "console-action", a.Meta(), n.log)
		},
		Logs: func(r api.LogsRequest) (api.LogsReply, error) { return host.ReadLog(n.mods.supervisor.Dir, r) },
		Counters: func() (uint64, uint64) {
			return n.metrics.meter.Counts(n.quotaUse(n.reg.Names()), n.audit.NotGenuine())
		}})
}

// dashboardMesh is what the dashboard reads of the node.
type dashboardMesh struct{ n *Node }

var _ dashboard.Mesh = dashboardMesh{}

func (m dashboardMesh) Members() []dashboard.Member {
	var out []dashboard.Member // none: "members": null, as the node's own list encodes
	for _, mem := range m.n.Members() {
		out = append(out, dashboard.Member(mem))
	}
	return out
}

func (m dashboardMesh) Streams(consumers bool) ([]embedbus.StreamState, error) {
	return m.n.bus.Streams(consumers)
}

func (m dashboardMesh) Seats(backlog func(stream string) (uint64, bool)) []api.SeatStatus {
	if m.n.seats == nil {
		return nil
	}
	return m.n.seats.statusWith(backlog)
}

// UIWatchers is how many dashboard pages' live streams the node is serving now.
func (n *Node) UIWatchers() int { return n.web.dash.Watchers() }

// ready reports whether the bus accepts connections and JetStream answers.
func (n *Node) ready(ctx context.Context) error {
	if err := n.alarms.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	return n.bus.Ready(ctx)
}

// Status reports the node's state.
func (n *Node) Status(ctx context.Context) api.NodeStatus {
	st := n.bus.Stats()
	s := api.NodeStatus{
		Name:          n.id.Name,
		MeshID:        n.id.MeshID,
		Version:       formats.MeshnodeVersion(),
		ClientURL:     n.bus.ClientURL(),
		HTTPURL:       n.HTTPURL(),
		ClusterAddr:   n.cfg.ClusterAddr,
		GossipAddr:    n.cfg.GossipAddr,
		Started:       n.started,
		UptimeSeconds: time.Since(n.started).Seconds(),
		Connections:   st.Connections,
		Growing:       n.Growing(),
		JetStream: api.NodeJetStreamStatus{
			Enabled:   true,
			Mode:      "standalone",
			Streams:   st.Streams,
			Consumers: st.Consumers,
			Messages:  st.Messages,
			Bytes:     st.Bytes,
		},
	}
	if n.bus.Clustered() {
		s.JetStream.Mode, s.JetStream.MetaLeader, s.JetStream.Peers = "clustered", n.bus.MetaLeader(), n.bus.Peers()
	}
	if n.mods.host != nil {
		s.AppliedRevision = n.mods.host.Applied().Revision
	}
	if err := n.ready(ctx); err != nil {
		s.Reason = err.Error()
	} else {
		s.Ready = true
	}
	s.Audit = n.auditStatus(ctx)
	if n.mesh.members != nil {
		s.Members = n.mesh.members.Versions()
	}
	if w := n.mesh.formats; w != nil {
		s.Formats, s.FormatsError = w.Status()
	}
	if n.reg != nil {
		rctx, cancel := context.WithTimeout(ctx, readyTimeout)
		s.Replication = replication.Status(rctx, n.bus.JetStream(), n.servers())
		cancel()
	}
	return s
}

// auditStatus reads the audit log's counters and its lag behind EVENTS.
func (n *Node) auditStatus(ctx context.Context) api.NodeAuditStatus {
	if n.audit == nil {
		return api.NodeAuditStatus{}
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	return n.audit.Status(ctx, n.bus.JetStream())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// Members lists the mesh's servers as this node sees them.
func (n *Node) Members() []api.NodeMember {
	var out []api.NodeMember
	leader := n.bus.MetaLeader()
	held := map[string][]string{}
	if n.seats != nil {
		for _, l := range n.seats.store.All() {
			held[l.Node] = append(held[l.Node], l.Seat)
		}
	}
	if n.mesh.members == nil {
		return []api.NodeMember{{Name: n.id.Name, Address: n.bus.ClientURL(), State: "alive", JetStream: "standalone", Seats: sorted(held[n.id.Name]), Version: formats.MeshnodeVersion()}}
	}
	peers := n.bus.Peers()
	// Address is the client URL on a single node and in a mesh alike: what an operator
	// passes to --server; the gossip address is the mesh's own business, shown apart.
	for _, m := range n.mesh.members.Members() {
		out = append(out, api.NodeMember{Name: m.Name, Address: m.Client, GossipAddr: m.Addr, State: m.State, JetStream: jetStreamRole(leader, peers, m.Name, m.State), Seats: sorted(held[m.Name]), Version: m.Version})
	}
	slices.SortFunc(out, func(a, b api.NodeMember) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// jetStreamRole is a mesh member's JetStream role as Members shows it, from the meta leader's
// name and its peers (each current or not), and the member's gossip state.
func jetStreamRole(leader string, peers map[string]bool, name, state string) string {
	current, peer := peers[name]
	switch {
	case !peer:
		return "none" // not (or no longer) a JetStream peer: it left, or was removed
	case state != "alive" && state != "suspect":
		return "offline" // dead, stopped, or left with its removal not done: what JetStream last said of it went with it
	case name == leader:
		return "leader"
	case !current:
		return "offline"
	}
	return "follower"
}

func sorted(xs []string) []string {
	slices.Sort(xs)
	if xs == nil {
		return []string{}
	}
	return xs
}
