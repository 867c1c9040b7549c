package membership

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/meshnode/meshnode/api"
)

// Errors of refused nodes.
var (
	// ErrForeign means a node of another mesh tried to join, or this node tried to join one.
	ErrForeign = errors.New("node of another mesh")
	// ErrFoundingSpent means a node came with the founding token after the mesh had formed.
	ErrFoundingSpent = errors.New("founding token spent")
	// ErrGossipKey means a seed answered but did not speak with this node's gossip key: it is
	// of another mesh, or this node's key is wrong.
	ErrGossipKey = errors.New("gossip key does not match")
)

// Meta is what a node tells the others: its name, its mesh, and where its bus listens. It
// travels as memberlist's node meta, which must stay under 512 bytes.
type Meta struct {
	Name   string `json:"n"`
	MeshID string `json:"m"`
	Route  string `json:"r,omitempty"` // nats-route://host:port
	Client string `json:"c,omitempty"` // nats://host:port
	Leaf   string `json:"l,omitempty"` // where sites link to it (nats-leaf:// or tls://); "": it takes none
	// Version is the node's meshnode version, so every member shows the others' during a
	// rolling upgrade; "" from a meshnode older than this field (an older node ignores it).
	Version string `json:"v,omitempty"`
	// Formats is, for each format servers write and read of one another, the oldest version
	// the node reads and the version it writes (package formats, Advertise); absent from a
	// meshnode older than this field, which reads and writes version 1 of each.
	Formats map[string][2]int `json:"f,omitempty"`
	// Formed lists the servers the mesh formed with, once it has (empty before): a node not
	// among them that never formed came with the founding token after it was spent (DESIGN
	// §9), and is refused; later nodes join with a vault-minted token.
	Formed []string `json:"x,omitempty"`
	// Bye is why the node says goodbye, announced just before it does: "leave" (it leaves the
	// mesh for good) or "stop" (it stops for a while). memberlist reports a goodbye and a
	// crash alike; without a Bye the node failed.
	Bye string `json:"b,omitempty"`
}

// Config is what a node decides about its membership.
type Config struct {
	Meta Meta
	// BindAddr is host:port to gossip on; port 0 picks a free one.
	BindAddr string
	// AdvertiseAddr is the host:port the others reach this node at; empty: BindAddr.
	AdvertiseAddr string
	// GossipKey is the mesh's gossip key (32 bytes: AES-256-GCM).
	GossipKey []byte
	// Log receives memberlist's log at debug level; nil discards it.
	Log *slog.Logger
	// OnChange, if set, is told of every member that joins, fails, leaves or changes. It is
	// called on memberlist's goroutines, under its locks: it must not block or call back.
	OnChange func(Member)
}

// Member is one node as this node sees it.
type Member struct {
	Meta
	Addr  string `json:"addr"`
	State string `json:"state"` // alive, dead (failed), left (for good), stopped (for a while)
}

// Membership is this node's view of the mesh's members.
type Membership struct {
	ml   *memberlist.Memberlist
	d    *delegate
	addr string

	log     *slog.Logger
	marking sync.WaitGroup // update's broadcasts, which Stop and Leave wait for

	stop    sync.Once
	stopErr error
}

// Open starts gossiping. It does not join anyone: Join does.
func Open(cfg Config) (*Membership, error) {
	if len(cfg.GossipKey) != 32 {
		return nil, fmt.Errorf("gossip key is %d bytes, want 32", len(cfg.GossipKey))
	}
	meta, err := json.Marshal(cfg.Meta)
	if err != nil || len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("node meta is %d bytes, over memberlist's %d", len(meta), memberlist.MetaMaxSize)
	}
	host, port, err := splitHostPort(cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: %w", cfg.BindAddr, err)
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Meta.Name
	mc.BindAddr, mc.BindPort = host, port
	if cfg.AdvertiseAddr != "" {
		ah, ap, err := splitHostPort(cfg.AdvertiseAddr)
		if err != nil {
			return nil, fmt.Errorf("advertise address %q: %w", cfg.AdvertiseAddr, err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = ah, ap
	} else if host != "0.0.0.0" && host != "::" && host != "" {
		// Advertise the bound address; memberlist's default advertise port is 7946, not the
		// bound one, and a node advertised at the wrong port is soon declared dead.
		mc.AdvertiseAddr, mc.AdvertisePort = host, port
	}
	mc.SecretKey = cfg.GossipKey
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	logger := cfg.Log
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	mc.Logger = log.New(logWriter{logger}, "", 0)
	d := &delegate{meta: meta, mesh: cfg.Meta.MeshID, self: cfg.Meta, onChange: cfg.OnChange}
	mc.Delegate, mc.Alive, mc.Merge, mc.Events = d, d, d, d
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("gossip on %s: %w", cfg.BindAddr, err)
	}
	self := ml.LocalNode()
	return &Membership{ml: ml, d: d, log: logger, addr: net.JoinHostPort(self.Addr.String(), strconv.Itoa(int(self.Port)))}, nil
}

// MarkFormed records the servers the mesh formed with and tells the others, so a node that
// comes later with the founding token is refused. It does not wait for the news to spread
// (memberlist takes a few gossip rounds, 400 ms on loopback, which formation need not
// spend): the others also learn it in every state exchange.
func (m *Membership) MarkFormed(members []string) {
	m.update("tell the mesh it has formed", func(self *Meta) bool { self.Formed = slices.Clone(members); return true })
}

// BoundClient completes the client URL this node advertises once its bus has bound the port
// the configuration left to the system (":0"), from url, the bus's: the others list this
// node at the port its modules and CLI can reach.
func (m *Membership) BoundClient(busURL string) {
	u, err := url.Parse(busURL) // nats://, or tls:// with TLS on the client port
	if err != nil || u.Port() == "" {
		return
	}
	bound := u.Port()
	m.update("advertise the client URL", func(self *Meta) bool {
		host, port, err := net.SplitHostPort(strings.TrimPrefix(self.Client, "nats://"))
		if err != nil || port != "0" {
			return false
		}
		self.Client = "nats://" + net.JoinHostPort(host, bound)
		return true
	})
}

// update changes this node's meta with change, if it says it changed it, and tells the
// others without waiting for the news to spread (Stop and Leave wait for it); what is
// logged if that fails.
func (m *Membership) update(what string, change func(self *Meta) bool) {
	m.d.mu.Lock()
	if !change(&m.d.self) {
		m.d.mu.Unlock()
		return
	}
	m.d.meta, _ = json.Marshal(m.d.self)
	m.d.mu.Unlock()
	m.marking.Add(1)
	go func() {
		defer m.marking.Done()
		if err := m.ml.UpdateNode(2 * time.Second); err != nil {
			m.log.Warn(what, "err", err)
		}
	}()
}

// Addr is the gossip address the others reach this node at.
func (m *Membership) Addr() string { return m.addr }

// Join contacts seeds; it succeeds when at least one answered as a member of this mesh.
func (m *Membership) Join(seeds []string) error {
	n, err := m.ml.Join(seeds)
	if err == nil && n > 0 {
		return nil
	}
	if ferr := m.d.foreign(); ferr != nil {
		return ferr
	}
	if err == nil {
		err = errors.New("no node answered")
	}
	if !unreachable(err) {
		// Something listens there, but the exchange failed: memberlist drops what it cannot
		// decrypt, so the other side hangs up.
		return fmt.Errorf("join %s: %w (%v): the node there is of another mesh, or this node's key is wrong — join with a token of that mesh",
			strings.Join(seeds, ", "), ErrGossipKey, err)
	}
	return fmt.Errorf("join %s: %v; nothing answered there yet — check that the address is a meshnode gossip address of this mesh and that the node runs",
		strings.Join(seeds, ", "), err)
}

// unreachable reports whether a join failed only because nothing answered.
func unreachable(err error) bool {
	s := err.Error()
	for _, x := range []string{"connection refused", "i/o timeout", "no route to host", "network is unreachable", "no such host", "no node answered"} {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

// Members returns every node known, this one included: the live ones, and those that left
// or failed since this node started (until Forget).
func (m *Membership) Members() []Member {
	if m == nil {
		return nil // a single node: no gossip
	}
	var out []Member
	live := map[string]bool{}
	for _, n := range m.ml.Members() {
		out = append(out, member(n))
		live[n.Name] = true
	}
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	for name, g := range m.d.gone {
		if !live[name] {
			out = append(out, g)
		}
	}
	return out
}

// Versions are the members' meshnode versions, by name: what a node's status shows of a
// rolling upgrade.
func (m *Membership) Versions() []api.MemberVersion {
	var out []api.MemberVersion
	for _, mb := range m.Members() {
		out = append(out, api.MemberVersion{Name: mb.Name, State: mb.State, Version: mb.Version})
	}
	slices.SortFunc(out, func(a, b api.MemberVersion) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Forget drops a member that left or failed from Members: it was removed from the mesh.
func (m *Membership) Forget(name string) {
	m.d.mu.Lock()
	delete(m.d.gone, name)
	m.d.mu.Unlock()
}

// Leave tells the others this node leaves the mesh for good, then stops gossiping.
// Only the first of Leave, Stop and Close acts.
func (m *Membership) Leave(timeout time.Duration) error { return m.goodbye("leave", timeout) }

// Stop tells the others this node stops for a while, then stops gossiping.
func (m *Membership) Stop(timeout time.Duration) error { return m.goodbye("stop", timeout) }

func (m *Membership) goodbye(why string, timeout time.Duration) error {
	m.stop.Do(func() {
		m.marking.Wait()
		m.d.mu.Lock()
		m.d.self.Bye = why
		m.d.meta, _ = json.Marshal(m.d.self)
		m.d.mu.Unlock()
		if err := m.ml.UpdateNode(timeout); err != nil {
			m.stopErr = err
		}
		if err := m.ml.Leave(timeout); m.stopErr == nil {
			m.stopErr = err
		}
		if err := m.ml.Shutdown(); m.stopErr == nil {
			m.stopErr = err
		}
	})
	return m.stopErr
}

// Left records that the member name announced it leaves the mesh, by other means than
// gossip (its stored `left` event): its goodbye over gossip, a UDP broadcast just before it
// ends, can come after its end or not at all, and it would show as failed. A loaded CI run
// listed a server that had left as dead.
func (m *Membership) Left(name string) {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	if m.d.left == nil {
		m.d.left = map[string]bool{}
	}
	m.d.left[name] = true
	if g, ok := m.d.gone[name]; ok && g.State == "dead" {
		g.State = "left"
		m.d.gone[name] = g
	}
}

// Close stops gossiping without a goodbye (the others see this node fail).
func (m *Membership) Close() error {
	m.stop.Do(func() { m.stopErr = m.ml.Shutdown() })
	m.marking.Wait() // ends at its timeout, if not before
	return m.stopErr
}

// delegate is memberlist's view of meshnode: it hands out the node meta and refuses nodes
// of another mesh.
type delegate struct {
	meta     []byte
	mesh     string
	self     Meta
	onChange func(Member)

	mu         sync.Mutex
	lastRefuse error
	gone       map[string]Member // members that left or failed, as last seen: memberlist lists only live ones
	left       map[string]bool   // members that announced they leave the mesh (Left)
}

var (
	_ memberlist.Delegate      = (*delegate)(nil)
	_ memberlist.AliveDelegate = (*delegate)(nil)
	_ memberlist.MergeDelegate = (*delegate)(nil)
	_ memberlist.EventDelegate = (*delegate)(nil)
)

func (d *delegate) NodeMeta(int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.meta
}
func (d *delegate) NotifyMsg([]byte)                {}
func (d *delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (d *delegate) LocalState(bool) []byte          { return nil }
func (d *delegate) MergeRemoteState([]byte, bool)   {}
func (d *delegate) NotifyJoin(n *memberlist.Node) {
	d.mu.Lock()
	delete(d.left, n.Name) // a server of that name joined again (a new machine, a new data dir)
	d.mu.Unlock()
	d.changed(n, false)
}
func (d *delegate) NotifyLeave(n *memberlist.Node)       { d.changed(n, true) }
func (d *delegate) NotifyUpdate(n *memberlist.Node)      { d.changed(n, false) }
func (d *delegate) NotifyAlive(n *memberlist.Node) error { return d.check(n) }

// changed tells OnChange of n. memberlist reports a goodbye and a failure alike
// (NotifyLeave); the Bye the node announced first tells them apart.
func (d *delegate) changed(n *memberlist.Node, gone bool) {
	m := member(n)
	d.mu.Lock()
	if gone {
		switch {
		case m.Bye == "leave" || d.left[n.Name]:
			m.State = "left"
		case m.Bye == "stop":
			m.State = "stopped"
		default:
			m.State = "dead"
		}
	}
	if gone {
		if d.gone == nil {
			d.gone = map[string]Member{}
		}
		d.gone[n.Name] = m
	} else {
		delete(d.gone, n.Name)
	}
	d.mu.Unlock()
	if d.onChange != nil {
		d.onChange(m)
	}
}

func member(n *memberlist.Node) Member {
	var meta Meta
	json.Unmarshal(n.Meta, &meta)
	if meta.Name == "" {
		meta.Name = n.Name
	}
	return Member{Meta: meta, Addr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))), State: "alive"}
}

func (d *delegate) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		if err := d.check(n); err != nil {
			return err
		}
	}
	return nil
}

// check refuses a node that does not belong to this mesh, and remembers why for Join.
func (d *delegate) check(n *memberlist.Node) error {
	var meta Meta
	if err := json.Unmarshal(n.Meta, &meta); err != nil || meta.MeshID == "" {
		return d.refuse(fmt.Errorf("%w: %s at %s is not a meshnode node (no mesh in its meta)", ErrForeign, n.Name, n.Addr))
	}
	if meta.MeshID != d.mesh {
		return d.refuse(fmt.Errorf("%w: %s at %s belongs to mesh %s, this node to mesh %s; a node joins one mesh, with that mesh's token",
			ErrForeign, meta.Name, n.Addr, meta.MeshID, d.mesh))
	}
	d.mu.Lock()
	self := d.self
	d.mu.Unlock()
	// A formed node refuses a never-formed node it did not form with; a never-formed node
	// refuses a mesh that formed without it.
	if len(self.Formed) > 0 && len(meta.Formed) == 0 && !slices.Contains(self.Formed, meta.Name) {
		return d.refuse(fmt.Errorf("%w: %s came with mesh %s's founding token, but the mesh formed with %s; join with a token from `meshnode token create`",
			ErrFoundingSpent, meta.Name, d.mesh, strings.Join(self.Formed, ", ")))
	}
	if len(self.Formed) == 0 && len(meta.Formed) > 0 && !slices.Contains(meta.Formed, self.Name) {
		return d.refuse(fmt.Errorf("%w: mesh %s has formed with %s, without this node; its founding token is spent: join with a token from `meshnode token create`",
			ErrFoundingSpent, d.mesh, strings.Join(meta.Formed, ", ")))
	}
	return nil
}

func (d *delegate) refuse(err error) error {
	d.mu.Lock()
	d.lastRefuse = err
	d.mu.Unlock()
	return err
}

func (d *delegate) foreign() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastRefuse
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return host, port, nil
}

// logWriter turns memberlist's log lines into slog debug records.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Debug(strings.TrimSpace(string(p)), "component", "gossip")
	return len(p), nil
}

var _ io.Writer = logWriter{}
