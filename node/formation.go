package node

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/formats"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/membership"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/vault"
)

// formationReadyTimeout bounds the wait for a clustered JetStream to elect its meta leader.
const formationReadyTimeout = 60 * time.Second

// form gossips with the mesh's members and waits until the founded number of servers are
// alive (like Consul's bootstrap-expect), then returns the cluster options with every
// member's route. No server starts JetStream with fewer: two groups that bootstrap apart
// destroy one side's streams when they meet (DESIGN §6).
func (n *Node) form(ctx context.Context) (*embedbus.Cluster, error) {
	f := n.found
	adv, err := advertised(n.cfg, f.Seeds)
	if err != nil {
		return nil, err
	}
	if n.cfg.Advertise == "" {
		adv.gossip = "" // the bound address, whose port memberlist knows once bound
	}
	m, err := membership.Open(membership.Config{
		Meta: membership.Meta{Name: n.id.Name, MeshID: f.MeshID,
			Route: "nats-route://" + adv.route, Client: "nats://" + adv.client, Leaf: n.hub().URL(), Version: formats.MeshnodeVersion(), Formed: f.Members,
			Formats: formats.Advertise(n.formats())},
		BindAddr:      n.cfg.GossipAddr,
		AdvertiseAddr: adv.gossip,
		GossipKey:     f.GossipKey,
		Log:           n.log,
		OnChange:      n.memberChanged,
	})
	if err != nil {
		return nil, fmt.Errorf("gossip: %w; set --gossip-addr", err)
	}
	n.mesh.members = m
	n.mesh.formats = &formats.Watcher{Members: m.Members, OnSwitch: n.formatSwitched, Log: n.log.With("component", "formats")}
	n.closers.Push("membership", func() error { return m.Stop(time.Second) })
	seeds := slices.DeleteFunc(slices.Clone(f.Seeds), func(s string) bool { return s == m.Addr() || s == n.cfg.GossipAddr })
	// The first formation waits for every founding server; a restart of a formed mesh only for
	// a majority (JetStream's quorum), so one dead machine cannot keep the others down.
	need := f.Expect
	if f.Formed {
		need = f.Expect/2 + 1
	}
	var lastLog time.Time
	var lastProgress string
	var keyErrSince time.Time // since when every join met a key nobody speaks
	var lastJoin time.Time
	for {
		// The members are looked at often (a founding node is ready sooner), the seeds
		// contacted less so.
		if len(seeds) > 0 && time.Since(lastJoin) >= formJoinEvery {
			lastJoin = time.Now()
			if err := m.Join(seeds); err != nil {
				if errors.Is(err, membership.ErrForeign) || errors.Is(err, membership.ErrFoundingSpent) {
					return nil, err
				}
				// A founding node whose key nobody speaks, again and again for a while, has a
				// damaged or foreign token (once may be a peer that hung up while restarting);
				// a formed node keeps trying (a seed's address may have been reused meanwhile).
				if !errors.Is(err, membership.ErrGossipKey) {
					keyErrSince = time.Time{}
				} else if keyErrSince.IsZero() {
					keyErrSince = time.Now()
				}
				if !keyErrSince.IsZero() && time.Since(keyErrSince) >= gossipKeyPatience && !f.Formed {
					return nil, err
				}
				n.log.Debug("gossip join", "seeds", seeds, "err", err)
			}
		}
		var alive []membership.Member
		for _, x := range m.Members() {
			if x.State == "alive" {
				alive = append(alive, x)
			}
		}
		if len(alive) >= need {
			cluster := &embedbus.Cluster{Name: f.MeshID, Addr: n.cfg.ClusterAddr, Advertise: adv.route, Secret: base64.RawURLEncoding.EncodeToString(f.RouteSecret)}
			n.mesh.routeOf = map[string]string{}
			for _, x := range alive {
				if x.Name != n.id.Name && x.Route != "" {
					cluster.Routes = append(cluster.Routes, x.Route)
					if u, err := url.Parse(x.Route); err == nil {
						n.mesh.routeOf[x.Name] = u.Host
					}
				}
			}
			n.log.Info("mesh formed", "members", names(alive))
			// Remember every member's gossip address, to find the mesh again after a restart.
			for _, x := range alive {
				if x.Name != n.id.Name && !slices.Contains(f.Seeds, x.Addr) {
					f.Seeds = append(f.Seeds, x.Addr)
				}
			}
			f.Formed = true
			if len(f.Members) == 0 {
				f.Members = names(alive)
			}
			if err := genesis.New(n.db).Keep(f); err != nil {
				return nil, fmt.Errorf("keep the mesh's members: %w", err)
			}
			m.MarkFormed(f.Members)
			return cluster, nil
		}
		progress := fmt.Sprintf("waiting for %d more node(s) to form mesh %s: have %s", need-len(alive), f.MeshID, strings.Join(names(alive), ", "))
		if progress != lastProgress {
			n.setPhase(progress) // /readyz says it
			// `meshnode status` also reads it from node.json, for a node whose HTTP address
			// it does not know.
			info := n.info()
			info.Forming = progress
			if err := datadir.WriteInfo(n.cfg.DataDir, info); err != nil {
				n.log.Warn("write formation progress", "err", err)
			}
			lastProgress = progress
		}
		if time.Since(lastLog) > 5*time.Second {
			n.log.Info(progress)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("formation of mesh %s stopped with %d of %d servers met: %w", f.MeshID, len(alive), need, ctx.Err())
		case <-time.After(formPoll):
		}
	}
}

// How often a forming node looks at its members, how often it contacts its seeds, and how
// long a founding node hears only gossip keys it does not speak before it gives up.
const (
	formPoll          = 20 * time.Millisecond
	formJoinEvery     = 50 * time.Millisecond
	gossipKeyPatience = 2 * time.Second
)

// addresses are what a server of a mesh tells the others to reach it at (host:port each).
type addresses struct{ route, client, gossip string }

// advertised returns the addresses this node advertises: its bound ones, with the host
// --advertise names when set. A node that would advertise an address nobody else can use —
// every interface (0.0.0.0), or loopback to peers elsewhere — refuses with the fix.
func advertised(cfg config.Config, seeds []string) (addresses, error) {
	var out addresses
	for _, a := range []struct {
		key, addr string
		to        *string
	}{{"cluster-addr", cfg.ClusterAddr, &out.route}, {"client-addr", cfg.ClientAddr, &out.client}, {"gossip-addr", cfg.GossipAddr, &out.gossip}} {
		host, port, err := net.SplitHostPort(a.addr)
		if err != nil {
			return out, fmt.Errorf("%s %q: %w", a.key, a.addr, err)
		}
		if cfg.Advertise != "" {
			host = cfg.Advertise
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			return out, fmt.Errorf("%s %s binds every interface, and the other servers must be told which address reaches this one: set --advertise to it (e.g. --advertise 10.0.0.2)", a.key, a.addr)
		}
		if meshca.Loopback(host) {
			for _, s := range seeds {
				if sh, _, err := net.SplitHostPort(s); err == nil && !meshca.Loopback(sh) {
					return out, fmt.Errorf("this node would advertise %s (%s) to peers that are elsewhere (%s): set --advertise to an address they reach this machine at, or bind %s to one", net.JoinHostPort(host, port), a.key, s, a.key)
				}
			}
		}
		*a.to = net.JoinHostPort(host, port)
	}
	return out, nil
}

func names(ms []membership.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	slices.Sort(out)
	return out
}

// Found prepares cfg's data dir as one of a new mesh's founding nodes, from the founding
// token genesis printed: it keeps the mesh's id, route credential and gossip key, and mints
// this node's own keys. The node then forms the mesh when started.
func Found(cfg config.Config, token string) (*genesis.Foundation, error) {
	return prepareMember(cfg, func() (*genesis.Foundation, error) { return genesis.Found(cfg.Name, token) })
}

// prepareMember keeps the foundation mint returns in cfg's data dir, which must hold no mesh
// yet: the common part of Found and Join.
func prepareMember(cfg config.Config, mint func() (*genesis.Foundation, error)) (*genesis.Foundation, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	db, err := datadir.Open(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	g := genesis.New(db)
	if f, err := g.Foundation(); err == nil {
		return nil, fmt.Errorf("%w %s; use `meshnode run`, or a fresh --data-dir", genesis.ErrExists, f.MeshID)
	}
	// Nor a mesh's data beside the store: the node would start over another mesh's
	// JetStream store and seeds.
	if err := datadir.CheckNoMeshData(db, cfg.DataDir); err != nil {
		return nil, err
	}
	f, err := mint()
	if err != nil {
		return nil, err
	}
	return f, g.Keep(f)
}

// Join prepares cfg's data dir as a new server of a formed mesh: it mints this node's keys,
// trades the join token (`meshnode token create`) for the mesh's enrolment — sealed to this
// node's xkey — and keeps it. The node then joins the mesh's gossip and routes when started.
func Join(ctx context.Context, cfg config.Config, token string) (*genesis.Foundation, error) {
	b, err := vault.ParseToken(token)
	if err != nil {
		return nil, err
	}
	if b.Expect == 1 {
		return nil, fmt.Errorf("join token %s is of mesh %s, a single node: a node joins a mesh of 3 or more servers; grow the single node first (`meshnode grow --expect 3` prints the token to join with); the token is unused", b.ID, b.MeshID)
	}
	return prepareMember(cfg, func() (*genesis.Foundation, error) {
		f, err := genesis.Member(cfg.Name)
		if err != nil {
			return nil, err
		}
		xkp, err := f.NodeXKey()
		if err != nil {
			return nil, err
		}
		e, err := vault.Enrol(ctx, token, cfg.Name, xkp)
		if err != nil {
			return nil, err
		}
		if e.Expect < 3 {
			return nil, fmt.Errorf("mesh %s is a single node: a node joins a mesh of 3 or more servers; grow it first with `meshnode grow --expect 3`", e.MeshID)
		}
		f.MeshID, f.RouteSecret, f.GossipKey, f.BarrierKey = e.MeshID, e.RouteSecret, e.GossipKey, e.BarrierKey
		f.Expect, f.Members, f.Seeds, f.Formed = e.Expect, e.Members, e.Seeds, true
		if e.Growing {
			// The mesh forms now, with the growing node: all of its servers meet first.
			f.Formed, f.AwaitGrowth = false, true
		}
		return f, nil
	})
}

// enrolment is what the vault hands a node that joins with a token: the mesh's foundation
// and where to find its members.
func (n *Node) enrolment() api.Enrolment {
	e := api.Enrolment{MeshID: n.id.MeshID, RouteSecret: n.found.RouteSecret, GossipKey: n.found.GossipKey,
		BarrierKey: n.found.BarrierKey, Expect: n.found.Expect, Members: n.found.Members}
	if n.tls.ca != nil {
		e.CA = n.tls.ca.Cert.Raw
	}
	if to := n.growTo(); to > 0 {
		e.Expect, e.Members, e.Growing = to, nil, true
	}
	m := n.mesh.members
	if m == nil {
		m = n.growMembers() // a single node growing: the joining nodes find it
	}
	if m != nil {
		for _, x := range m.Members() {
			if x.State == "alive" {
				e.Seeds = append(e.Seeds, x.Addr)
			}
		}
	}
	return e
}

// clientAddrs are the client URLs a join token names: this node's first, then every other
// live server's.
func (n *Node) clientAddrs() []string {
	out := []string{n.bus.ClientURL()}
	if m := n.mesh.members; m != nil {
		for _, x := range m.Members() {
			if x.State == "alive" && x.Name != n.id.Name && x.Client != "" {
				out = append(out, x.Client)
			}
		}
	}
	return out
}
