package embedbus

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/internal/jsretry"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// DefaultReadyTimeout bounds how long Open waits for the server to accept connections and
// JetStream to answer.
const DefaultReadyTimeout = 10 * time.Second

// DefaultHoldUnknown is how long an unknown key's connect waits for an incomplete Directory
// at most: longer than most clients' connect timeouts, and than a node's JetStream phase.
const DefaultHoldUnknown = 30 * time.Second

// tlsTimeout bounds a TLS handshake, on routes and clients.
const tlsTimeout = 5 * time.Second

// ErrAddrInUse is returned by Open when the client address is taken by another process.
var ErrAddrInUse = errors.New("address already in use")

// Config is what the node decides about its bus.
type Config struct {
	// Name is the server name; stable across restarts (it is the raft identity).
	Name string
	// StoreDir is JetStream's storage directory.
	StoreDir string
	// ClientAddr is host:port for clients; port 0 picks a free port.
	ClientAddr string
	// ReadyTimeout bounds start-up; zero means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Logger receives the server's log; nil discards it.
	Logger *slog.Logger
	// Directory says who may connect and with what permissions. Required.
	Directory Directory
	// Key is the node's own nkey: the in-process connection authenticates with it, and the
	// Directory gives it what the node's own work needs (the JetStream API and InboxPrefix
	// at least).
	Key nkeys.KeyPair
	// InboxPrefix is the in-process connection's inbox prefix ("" is nats.go's _INBOX): one
	// of its own, so its permissions can name its replies and nobody else's.
	InboxPrefix string
	// Cluster makes the server one of a clustered mesh; nil runs it standalone.
	Cluster *Cluster
	// ClientTLS makes the client port TLS only; nil: plain. In-process connections stay
	// plain either way.
	ClientTLS *tls.Config
	// MaxStore is the most JetStream stores on this server, in bytes; zero lets nats-server
	// size it from the disk (75% of what is free).
	MaxStore int64
	// SyncAlways makes JetStream fsync before each ack; otherwise it flushes every
	// SyncInterval (zero: nats-server's 2 minutes).
	SyncAlways   bool
	SyncInterval time.Duration
	// WatchInterval is how often a start that has not finished logs what it is doing; zero
	// means DefaultWatchInterval.
	WatchInterval time.Duration
	// StartMemoryLimit bounds the heap while the server starts, in bytes; zero means
	// DefaultStartMemoryLimit.
	StartMemoryLimit uint64
	// Complete is closed once the Directory knows every key it will admit (a node's, once it
	// has read its registry). Until then a key it does not know is held at the door — its
	// connect waits up to HoldUnknown for Complete — instead of refused at once: most NATS
	// clients give up for good at the second refusal in a row, and every one rides out a
	// connect that times out. nil: the Directory is complete from the start.
	Complete <-chan struct{}
	// HoldUnknown bounds how long an unknown key's connect waits for Complete; zero means
	// DefaultHoldUnknown.
	HoldUnknown time.Duration
	// OnStartMemory is called (once) when the start grows past StartMemoryLimit, with an
	// *ErrStartMemory. nats-server's restore cannot be interrupted: a process that owns its
	// fate (the meshnode binary) exits here; nil only logs.
	OnStartMemory func(error)
	// OnDenied is told, at most once per throttle.FloodWindow per connection and on the
	// server's goroutine (so it must be quick), of a client connection whose publishes the
	// permissions denied more than DeniedFlood times in the window; cid is its connection
	// id (KeyOf names its key). nil: not told.
	OnDenied func(cid uint64, denied int)
	// Domain is the server's JetStream domain ("": none). A site has its own, and the hub
	// names its own once it serves sites: each side reaches the other's JetStream as
	// $JS.<domain>.API, while nats-server keeps the two APIs from merging over the link.
	Domain string
	// Leaf makes the server accept sites' leafnode connections; nil: it accepts none.
	Leaf *LeafListen
	// Hub makes the server a site of a mesh: it opens a leafnode connection to the hub (out
	// of the site, so it works from behind NAT) and keeps opening it while it is down.
	Hub *Hub
	// ModuleOf names the module a client key is, for the line that logs its permission
	// violation (with the key): nats-server's line names neither. nil, or a key it does not
	// know: the line names the key only.
	ModuleOf func(key string) (module string, ok bool)
}

// Cluster is how a server joins its mesh's cluster. Every founding server starts with the
// routes of all the others (itself included, which nats-server ignores), so no server
// bootstraps JetStream on its own.
type Cluster struct {
	// Name is the cluster's name: the mesh id.
	Name string
	// Addr is host:port the server listens on for routes.
	Addr string
	// Routes are the other servers' route URLs (nats-route://host:port).
	Routes []string
	// Secret authenticates routes: the mesh's route credential.
	Secret string
	// Advertise is host:port the other servers reach this one's routes at (empty: Addr).
	Advertise string
	// NoAdvertise keeps this server's client URL from its peers, which would hand it to their
	// clients (and theirs from its own clients): for a bus whose client port is not the
	// node's (a growing node's, while it restores).
	NoAdvertise bool
	// TLS is the routes' TLS configuration (both ends verify each other); nil: plain.
	TLS *tls.Config
}

// LeafListen is where a hub server accepts sites. A site authenticates with its node's nkey,
// which the Directory must name Leaf; the Identity's permissions are the link's.
type LeafListen struct {
	// Addr is host:port the server listens on for leafnode connections.
	Addr string
	// Advertise is host:port sites reach this server's leafnode port at (empty: Addr).
	Advertise string
	// TLS is the leafnode port's TLS configuration; nil: plain.
	TLS *tls.Config
}

// Hub is how a site reaches its mesh.
type Hub struct {
	// URLs are the hub servers' leafnode URLs (nats-leaf://host:port, or tls://host:port);
	// the site connects to one of them and moves to another when it drops.
	URLs []string
	// Seed is the site node's nkey seed: the link authenticates with it.
	Seed []byte
	// TLS is the link's TLS configuration; nil: plain.
	TLS *tls.Config
	// Deny are subjects that never cross the link from either side, whatever the hub's
	// permissions for it say (a second wall: the hub's are the first).
	Deny []string
}

// Bus is a running embedded nats-server with JetStream and the node's in-process connection.
type Bus struct {
	sysKey nkeys.KeyPair // the system-account connection's key: JetStream peer removal
	auth   *authenticator
	srv    *server.Server
	conn   *nats.Conn
	js     jetstream.JetStream

	optsMu sync.Mutex
	opts   *server.Options // as started, less the routes dropped since (DropRoute)
	routed bool            // started as one server of a cluster
}

// Routes are the host:port of every route the server is configured with (and retries).
func (b *Bus) Routes() []string {
	b.optsMu.Lock()
	defer b.optsMu.Unlock()
	var out []string
	for _, r := range b.opts.Routes {
		out = append(out, r.Host)
	}
	return out
}

// DropRoute removes the configured route to addr (host:port) by a configuration reload:
// nats-server closes it and stops retrying it. It reports whether there was one.
func (b *Bus) DropRoute(addr string) (bool, error) {
	b.optsMu.Lock()
	defer b.optsMu.Unlock()
	opts := b.opts.Clone()
	opts.Routes = slices.DeleteFunc(opts.Routes, func(u *url.URL) bool { return u.Host == addr })
	if len(opts.Routes) == len(b.opts.Routes) {
		return false, nil
	}
	if err := b.srv.ReloadOptions(opts.Clone()); err != nil {
		return false, fmt.Errorf("drop the route to %s: %w", addr, err)
	}
	b.opts = opts
	return true, nil
}

// A server that stops answering without closing its routes — paused, frozen, cut off — keeps
// its subscriptions in the other servers' interest until they drop those routes as stale:
// requests to a queue group it has a member in (the controller's tools, the vault, a
// module's tools) go to it about as often as to a live member, and time out. nats-server
// pings routes every 30 s and drops one after two missed pongs, so for 60–90 s; the chaos
// runs saw registrations stall for over 30 s while a server was paused. Pinged every 5 s and
// dropped after three missed pongs, a silent server leaves the interest in 15–20 s, for a
// PING of a few bytes every 5 s on each route connection.
const (
	routePingInterval = 5 * time.Second
	routeMaxPingsOut  = 3
)

// Open starts the server, waits until it accepts connections and JetStream answers, and
// connects in-process. On any failure nothing is left running.
func Open(ctx context.Context, cfg Config) (*Bus, error) {
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	host, portStr, err := net.SplitHostPort(cfg.ClientAddr)
	if err != nil {
		return nil, fmt.Errorf("client address %q: %w", cfg.ClientAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("client address %q: bad port", cfg.ClientAddr)
	}
	// nats-server reports a taken port only through Fatalf from its accept loop; probing
	// first gives the user an error that names the address.
	if port != 0 {
		if err := probeListen(cfg.ClientAddr); err != nil {
			return nil, err
		}
	} else {
		port = server.RANDOM_PORT
	}

	if cfg.Directory == nil || cfg.Key == nil {
		return nil, errors.New("embedbus: a Directory and the node's Key are required")
	}
	if cfg.HoldUnknown == 0 {
		cfg.HoldUnknown = DefaultHoldUnknown
	}
	auth := newAuthenticator(cfg.Directory)
	auth.complete, auth.hold, auth.closed = cfg.Complete, cfg.HoldUnknown, make(chan struct{})
	sysKey, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	auth.sysKey, _ = sysKey.PublicKey()
	opts := &server.Options{
		ServerName: cfg.Name,
		Host:       host,
		Port:       port,
		NoSigs:     true,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		// Zero is "size it from the disk" to nats-server only while unset.
		JetStreamMaxStore: cfg.MaxStore,
		SyncAlways:        cfg.SyncAlways,
		SyncInterval:      cfg.SyncInterval,
		// nats-server 2.12 and later cap a stream at 1,000 consumers unless told otherwise,
		// and every module that consumes is a durable consumer on EVENTS: a mesh of a
		// thousand modules would refuse the next registration. The mesh bounds its
		// consumers itself (one per declared consumes, per node for the audit).
		JetStreamLimits: server.JSLimitOpts{DefaultMaxConsumers: -1},
		// The HTTP API is the node's own; nats-server's monitoring stays off.
		HTTPPort: 0,
		// nats-server keeps a record of each closed connection, 10,000 by default: about
		// 0.8 KB each (measured), so 8 MB of heap a long-running node held for every CLI
		// call, reconnect and restart. The last few hundred are enough to look into.
		MaxClosedClients: maxClosedClients,
		// Every client proves an nkey by signing the nonce; Check maps it to permissions.
		AlwaysEnableNonce:          true,
		CustomClientAuthentication: auth,
	}
	if c := cfg.Cluster; c != nil {
		chost, cport, err := splitAddr(c.Addr)
		if err != nil {
			return nil, fmt.Errorf("cluster address %q: %w", c.Addr, err)
		}
		if err := probeListen(c.Addr); err != nil {
			return nil, err
		}
		opts.Cluster = server.ClusterOpts{Name: c.Name, Host: chost, Port: cport, Username: "route", Password: c.Secret, Advertise: c.Advertise, NoAdvertise: c.NoAdvertise,
			PingInterval: routePingInterval, MaxPingsOut: routeMaxPingsOut}
		if c.TLS != nil {
			opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = c.TLS, tlsTimeout.Seconds()
		}
		for _, r := range c.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("route %q: %w", r, err)
			}
			u.User = url.UserPassword("route", c.Secret)
			opts.Routes = append(opts.Routes, u)
		}
	}
	if cfg.ClientTLS != nil {
		opts.TLS, opts.TLSConfig, opts.TLSTimeout = true, cfg.ClientTLS, tlsTimeout.Seconds()
	}
	opts.JetStreamDomain = cfg.Domain
	if err := leafOptions(opts, cfg.Leaf, cfg.Hub); err != nil {
		return nil, err
	}
	srv, err := server.NewServer(opts.Clone())
	if err != nil {
		return nil, fmt.Errorf("configure nats-server: %w", err)
	}
	auth.sysAccount = srv.SystemAccount
	lg := &logger{log: cfg.Logger, onDenied: cfg.OnDenied, moduleOf: cfg.ModuleOf,
		keyOf: func(cid uint64) (string, bool) { return keyOf(srv, cid) }}
	srv.SetLoggerV2(lg, false, false, false)
	started := make(chan struct{})
	if cfg.WatchInterval == 0 {
		cfg.WatchInterval = DefaultWatchInterval
	}
	if cfg.StartMemoryLimit == 0 {
		cfg.StartMemoryLimit = DefaultStartMemoryLimit
	}
	go watchStart(cfg.Logger, cfg.StoreDir, cfg.WatchInterval, cfg.StartMemoryLimit, cfg.OnStartMemory, started)
	srv.Start()
	defer close(started) // the watch covers the readiness wait below as well

	fail := func(err error) (*Bus, error) {
		auth.stop()
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, err
	}
	// Everything below waits for the server; ctx ends the wait (a signal during start).
	ctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	for !srv.ReadyForConnections(readyPoll) {
		if msg := lg.fatalMessage(); msg != "" {
			return fail(fmt.Errorf("start nats-server: %s", msg))
		}
		if ctx.Err() != nil {
			return fail(fmt.Errorf("start nats-server: not ready for connections: %w", context.Cause(ctx)))
		}
	}
	if msg := lg.fatalMessage(); msg != "" {
		return fail(fmt.Errorf("start nats-server: %s", msg))
	}
	if !srv.JetStreamEnabled() {
		return fail(errors.New("start nats-server: JetStream did not start (see the log above)"))
	}

	pub, err := cfg.Key.PublicKey()
	if err != nil {
		return fail(fmt.Errorf("node key: %w", err))
	}
	copts := []nats.Option{nats.InProcessServer(srv), nats.Name(cfg.Name + "-node"),
		nats.MaxReconnects(-1), nats.Nkey(pub, cfg.Key.Sign), nats.ErrorHandler(refusedOwn(lg.log))}
	if cfg.InboxPrefix != "" {
		copts = append(copts, nats.CustomInboxPrefix(cfg.InboxPrefix))
	}
	conn, err := nats.Connect("", copts...)
	if err != nil {
		return fail(fmt.Errorf("connect in-process: %w", err))
	}
	js, err := jetstream.New(conn)
	if err != nil {
		conn.Close()
		return fail(fmt.Errorf("jetstream: %w", err))
	}
	b := &Bus{auth: auth, srv: srv, conn: conn, js: js, sysKey: sysKey, opts: opts, routed: cfg.Cluster != nil}
	// A clustered JetStream answers only once a meta leader exists, and a request sent
	// before that is never answered: wait until the server's own meta group is current (a
	// look in-process, every few milliseconds), then ask, each time briefly, until ctx ends.
	err = errors.New("jetstream has no meta leader yet")
	announced := false
	for {
		if !srv.JetStreamIsClustered() || srv.JetStreamIsCurrent() {
			if srv.JetStreamIsClustered() && !announced {
				b.announceStats()
				announced = true
			}
			actx, acancel := context.WithTimeout(ctx, readyAsk)
			err = b.Ready(actx)
			acancel()
			if err == nil {
				return b, nil
			}
		}
		select {
		case <-ctx.Done():
			conn.Close()
			return fail(fmt.Errorf("%w (%w)", err, context.Cause(ctx)))
		case <-time.After(metaPoll):
		}
	}
}

// metaPoll is how often Open looks whether a clustered server's meta group is current;
// readyAsk bounds one readiness request once it is.
const (
	metaPoll = 10 * time.Millisecond
	readyAsk = 500 * time.Millisecond
)

// readyPoll is how long one wait for the server to accept connections lasts, between looks
// at the start's context.
const readyPoll = 100 * time.Millisecond

func splitAddr(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return host, port, nil
}

// probeListen binds addr and releases it, so a taken port is reported before the server
// starts.
func probeListen(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		if isAddrInUse(err) {
			return fmt.Errorf("listen on %s: %w", addr, ErrAddrInUse)
		}
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	return l.Close()
}

// Connect opens another in-process connection authenticated with key: how a part of the
// node with a bus identity of its own (the vault) talks on the bus. opts add to the
// in-process defaults (an inbox prefix of its own, say).
func (b *Bus) Connect(key nkeys.KeyPair, name string, opts ...nats.Option) (*nats.Conn, error) {
	pub, err := key.PublicKey()
	if err != nil {
		return nil, err
	}
	return nats.Connect("", append([]nats.Option{nats.InProcessServer(b.srv), nats.Name(name), nats.MaxReconnects(-1),
		nats.Nkey(pub, key.Sign)}, opts...)...)
}

// Dial opens an in-process connection to the server, on which the caller speaks the client
// protocol itself (the admitter, which passes messages on as they came).
func (b *Bus) Dial() (net.Conn, error) { return b.srv.InProcessConn() }

// MaxStore is the most JetStream stores on this server, in bytes, as the server settled it
// (from the configuration, or from the disk's free space).
func (b *Bus) MaxStore() int64 {
	if c := b.srv.JetStreamConfig(); c != nil {
		return c.MaxStore
	}
	return 0
}

// ClientURL is the URL clients connect to, with the port actually bound.
func (b *Bus) ClientURL() string { return b.srv.ClientURL() }

// Conn is the node's in-process connection.
func (b *Bus) Conn() *nats.Conn { return b.conn }

// JetStream is the node's JetStream handle on the in-process connection.
func (b *Bus) JetStream() jetstream.JetStream { return b.js }

// Ready returns nil when the server accepts connections and JetStream answers a request.
func (b *Bus) Ready(ctx context.Context) error {
	if !b.srv.Running() || b.srv.Addr() == nil {
		return errors.New("bus is not accepting connections")
	}
	if err := b.JetStreamDisabled(); err != nil {
		return err
	}
	if _, err := b.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("jetstream does not answer: %w", err)
	}
	return nil
}

// Grant returns the permissions a connection of publicKey is given when it connects now,
// exactly as handed to nats-server (nil permissions: everything); ok is false when the key
// may not connect.
func (b *Bus) Grant(publicKey, name string) (p *server.Permissions, ok bool) {
	id, ok := b.auth.dir.Identity(publicKey, name)
	if !ok {
		return nil, false
	}
	return serverPermissions(id), true
}

// Kick disconnects every connection of a key, so it reconnects and is checked again against
// the Directory: how a change of authority takes effect without ReloadOptions (which would
// disconnect every nkey client).
func (b *Bus) Kick(publicKey string) int { return b.kick(b.connections(publicKey, nil)) }

// KickInstance disconnects the connections of a key that carry the given name: one instance
// of a module, whose seat authority changed.
func (b *Bus) KickInstance(publicKey, name string) int {
	return b.kick(b.connections(publicKey, &name))
}

func (b *Bus) kick(ids []uint64) int {
	n := 0
	for _, id := range ids {
		if b.srv.DisconnectClientByID(id) == nil {
			n++
		}
	}
	return n
}

// connections returns the ids of the client connections open with publicKey (and, with a
// name, carrying it), as the server lists them: nothing is remembered per connection, so
// nothing outlives one (a connection that has sent CONNECT is listed, checked or not).
func (b *Bus) connections(publicKey string, name *string) []uint64 {
	var ids []uint64
	b.eachConn(server.ConnzOptions{User: publicKey}, func(ci *server.ConnInfo) {
		if name == nil || ci.Name == *name {
			ids = append(ids, ci.Cid)
		}
	})
	return ids
}

// eachConn calls f with each open client connection Connz lists with opts, a page at a
// time; it stops at the first page the server cannot list.
func (b *Bus) eachConn(opts server.ConnzOptions, f func(*server.ConnInfo)) { eachConn(b.srv, opts, f) }

// eachConn is Bus.eachConn on srv.
func eachConn(srv *server.Server, opts server.ConnzOptions, f func(*server.ConnInfo)) {
	opts.Limit = connzPage
	for opts.Offset = 0; ; {
		cz, err := srv.Connz(&opts)
		if err != nil {
			return
		}
		for _, ci := range cz.Conns {
			f(ci)
		}
		if len(cz.Conns) < connzPage {
			return
		}
		opts.Offset += len(cz.Conns)
	}
}

// maxClosedClients bounds the closed connections nats-server remembers (Connz, state closed).
const maxClosedClients = 256

// connzPage is how many connections one Connz call lists.
const connzPage = 1024

// Connected reports whether a client connection authenticated with publicKey and carrying the
// given connection name is open on this server.
func (b *Bus) Connected(publicKey, name string) bool {
	return len(b.connections(publicKey, &name)) > 0
}

// MetaLeader is the name of the JetStream meta leader this server knows; "" when there is
// none (or the server is standalone).
func (b *Bus) MetaLeader() string {
	jsz, err := b.srv.Jsz(&server.JSzOptions{})
	if err != nil || jsz.Meta == nil {
		return ""
	}
	return jsz.Meta.Leader
}

// Errors of peer removal.
var (
	// ErrNotPeer means the server named is not a peer of the JetStream meta group.
	ErrNotPeer = errors.New("not a JetStream peer of this mesh")
	// ErrChangeInFlight means another change of the meta group's peers is being made (a
	// removal asked for earlier, perhaps): ask again shortly. It is a settling error of
	// jsretry's, so jsretry.Request asks again.
	ErrChangeInFlight = fmt.Errorf("a change of JetStream peers is in progress (%w)", jsretry.ErrSettling)
)

// RemovePeer asks the JetStream meta leader to remove the server named from the meta group
// ($JS.API.SERVER.REMOVE, a system-account request): nats-server never removes a peer by
// itself. It returns once the removal has committed.
func (b *Bus) RemovePeer(ctx context.Context, name string) error {
	req, _ := json.Marshal(server.JSApiMetaServerRemoveRequest{Server: name})
	var resp server.JSApiMetaServerRemoveResponse
	if err := b.sysRequest(ctx, "$JS.API.SERVER.REMOVE", req, &resp); err != nil {
		return fmt.Errorf("remove peer %s: %w", name, err)
	}
	if resp.Error != nil {
		switch server.ErrorIdentifier(resp.Error.ErrCode) {
		case server.JSClusterServerNotMemberErr:
			return fmt.Errorf("%s is %w", name, ErrNotPeer)
		case server.JSClusterServerMemberChangeInflightErr:
			return fmt.Errorf("remove peer %s: %w", name, ErrChangeInFlight)
		}
		return fmt.Errorf("remove peer %s: %s", name, resp.Error.Description)
	}
	return nil
}

// StepDown asks the JetStream meta leader to hand its leadership to another server.
func (b *Bus) StepDown(ctx context.Context) error {
	var resp server.JSApiLeaderStepDownResponse
	if err := b.sysRequest(ctx, "$JS.API.META.LEADER.STEPDOWN", []byte("{}"), &resp); err != nil {
		return fmt.Errorf("meta leader step-down: %w", err)
	}
	if resp.Error != nil {
		return fmt.Errorf("meta leader step-down: %s", resp.Error.Description)
	}
	return nil
}

// announceStats asks every server of the cluster to send its statistics now. The meta leader
// places a replicated stream only on servers whose statistics it has, and a server sends
// them by itself 250 ms after its start (usually before its routes are up), then once a
// second at most: left to that, a new mesh refuses its first streams for up to 1.5 s ("no
// suitable peers for placement"). A ping without a reply subject makes each server
// broadcast them at once (nats-server's statszReq).
func (b *Bus) announceStats() {
	pub, _ := b.sysKey.PublicKey()
	nc, err := nats.Connect("", nats.InProcessServer(b.srv), nats.Name("system"), nats.Nkey(pub, b.sysKey.Sign))
	if err != nil {
		return // they come by themselves, later
	}
	defer nc.Close()
	nc.Publish("$SYS.REQ.SERVER.PING", nil)
	nc.Flush()
}

// sysRequest sends a request as the server's system account, which JetStream's cluster
// administration requires, and decodes the answer into out.
func (b *Bus) sysRequest(ctx context.Context, subject string, data []byte, out any) error {
	pub, _ := b.sysKey.PublicKey()
	nc, err := nats.Connect("", nats.InProcessServer(b.srv), nats.Name("system"), nats.Nkey(pub, b.sysKey.Sign))
	if err != nil {
		return fmt.Errorf("system connection: %w", err)
	}
	defer nc.Close()
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		return fmt.Errorf("answer %q: %w", msg.Data, err)
	}
	return nil
}

// Peers are the servers of the JetStream meta group as this server knows them (itself
// included), with whether each is online.
func (b *Bus) Peers() map[string]bool {
	out := map[string]bool{}
	jsz, err := b.srv.Jsz(&server.JSzOptions{})
	if err != nil || jsz.Meta == nil {
		return out
	}
	out[b.srv.Name()] = true
	if jsz.Meta.Leader != "" {
		out[jsz.Meta.Leader] = true
	}
	for _, r := range jsz.Meta.Replicas {
		out[r.Name] = !r.Offline
	}
	return out
}

// JetStreamDisabled says so when nats-server has switched JetStream off on this server since
// it started — it does when the store's disk runs out of room ("JetStream out of resources,
// will be DISABLED") and does not switch it back on. The node's other servers still answer
// the JetStream API, so a request would not notice; this server keeps no copy any more.
func (b *Bus) JetStreamDisabled() error {
	if b.srv.JetStreamEnabled() {
		return nil
	}
	return errors.New("JetStream is disabled on this server (nats-server switches it off when its store's disk is full, and does not switch it back on): free space on the data dir's disk, then restart the node")
}

// Clustered reports whether the server runs JetStream clustered (a meta group), as the
// server itself says; a standalone server has none.
func (b *Bus) Clustered() bool {
	if b.routed && !b.srv.JetStreamEnabled() {
		return true // JetStream switched off here: still a cluster's server, whose count is not 1
	}
	jsz, err := b.srv.Jsz(&server.JSzOptions{})
	return err == nil && jsz.Meta != nil
}

// Stats is a snapshot of the bus for metrics and status.
type Stats struct {
	Connections int    // client connections, the node's own included
	Streams     int    // JetStream streams
	Consumers   int    // JetStream consumers
	Messages    uint64 // messages stored in JetStream
	Bytes       uint64 // bytes stored in JetStream
}

// Stats reads the server's counters without a network round trip.
func (b *Bus) Stats() Stats {
	st := Stats{Connections: b.srv.NumClients()}
	if jsz, err := b.srv.Jsz(&server.JSzOptions{}); err == nil {
		st.Streams = jsz.Streams
		st.Consumers = jsz.Consumers
		st.Messages = jsz.Messages
		st.Bytes = jsz.Bytes
	}
	return st
}

// StreamState is one stream as this server holds it, with its consumers.
type StreamState struct {
	Name      string
	Messages  uint64
	Bytes     uint64
	LastSeq   uint64
	Replicas  int
	Consumers []ConsumerState
}

// ConsumerState is one consumer's lag.
type ConsumerState struct {
	Name        string
	Pending     uint64 // not delivered yet
	AckPending  int    // delivered, not acknowledged
	Redelivered int
	Delivered   uint64 // deliveries made, redeliveries included (the consumer sequence)
	Acked       uint64 // deliveries acknowledged, up to the ack floor
	Durable     bool   // a named consumer, not a watch's or a fetch's ephemeral one
}

// Streams reads every stream this server holds, with its consumers when asked, in-process:
// no JetStream API request. The consumers are most of the cost (a thousand modules' consumers
// take tens of milliseconds), so the dashboard asks for them less often than for the streams.
func (b *Bus) Streams(consumers bool) ([]StreamState, error) {
	jsz, err := b.srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true, Consumer: consumers, Config: true})
	if err != nil {
		return nil, err
	}
	var out []StreamState
	for _, acc := range jsz.AccountDetails {
		for _, sd := range acc.Streams {
			st := StreamState{Name: sd.Name, Messages: sd.State.Msgs, Bytes: sd.State.Bytes, LastSeq: sd.State.LastSeq}
			if sd.Config != nil {
				st.Replicas = sd.Config.Replicas
			}
			for _, ci := range sd.Consumer {
				st.Consumers = append(st.Consumers, ConsumerState{Name: ci.Name, Pending: ci.NumPending, AckPending: ci.NumAckPending,
					Redelivered: ci.NumRedelivered, Delivered: ci.Delivered.Consumer, Acked: ci.AckFloor.Consumer,
					Durable: ci.Config != nil && ci.Config.Durable != ""})
			}
			out = append(out, st)
		}
	}
	return out, nil
}

// Close drains the in-process connection and shuts the server down, waiting until it has.
func (b *Bus) Close() error {
	b.conn.Close()
	b.auth.stop() // a held connect's Check ends, or Shutdown waits for it
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
	return nil
}

func isAddrInUse(err error) bool { return errors.Is(err, syscall.EADDRINUSE) }

// refusedOwn is the node's own connection's error handler: the bus refusing the node
// something is a defect of the node (its permissions miss what its work needs, or its work
// strays where it never should), so it is logged as an error that says so.
func refusedOwn(log *slog.Logger) nats.ErrHandler {
	return func(_ *nats.Conn, sub *nats.Subscription, err error) {
		// nats.go hands a permission violation over without its subscription: the error
		// names the subject.
		attrs := []any{"err", err}
		if sub != nil {
			attrs = append(attrs, "subject", sub.Subject)
		}
		if errors.Is(err, nats.ErrPermissionViolation) {
			log.Error("the bus refused the node's own connection: a defect of meshnode, please report it", attrs...)
			return
		}
		log.Warn("the node's own connection", attrs...)
	}
}
