package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/dashboard"
	"github.com/meshnode/meshnode/deadletter"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/internal/lifecycle"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/membership"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sandbox"
	"github.com/meshnode/meshnode/seats"
	"github.com/meshnode/meshnode/throttle"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/errgroup"
)

// openTimeout bounds the JetStream work of Open: the registry's bucket and the topology.
const openTimeout = 30 * time.Second

// replicas is the replication of the mesh's streams and buckets: 1 on a single node, 3 in a
// mesh of 3 or more.
func (n *Node) replicas() int {
	if n.found != nil && n.found.Expect >= 3 {
		return 3
	}
	return 1
}

// Errors of Open.
var (
	// ErrHTTPAddrInUse is returned by Open when the HTTP address is taken.
	ErrHTTPAddrInUse = errors.New("http address already in use")
)

// Node is one meshnode: its store, its bus and its HTTP API.
type Node struct {
	// CreateIdentity runs genesis — a new mesh with this node as its first — when the data
	// dir holds no mesh; without it Open refuses an empty data dir. Set before Open.
	CreateIdentity bool
	// Expect is the number of servers genesis expects (1, or 3 or more); zero means 1.
	Expect int
	// HandleSignals adds a SIGINT/SIGTERM actor to Run; a signal ends Run with nil.
	HandleSignals bool
	// OnStartMemory is called if the bus's start grows past its memory limit (a damaged
	// store): see embedbus.Config.OnStartMemory. Nil only logs.
	OnStartMemory func(error)
	// StartMemoryLimit bounds the heap while the bus starts; zero: the bus's default.
	StartMemoryLimit uint64

	cfg     config.Config
	log     *slog.Logger // with the node's name
	rootLog *slog.Logger // as New was given it: log again once the data dir names the node

	started     time.Time
	db          *bolt.DB
	id          Identity
	found       *genesis.Foundation
	key         nkeys.KeyPair
	bus         *embedbus.Bus
	budget      storeBudget        // the byte limits of the mesh's streams and buckets on this node
	alarms      alarms             // standing reasons not to be ready (drift.go)
	lossSub     *nats.Subscription // answers api.NodeToolAcceptLoss
	respNC      *nats.Conn         // answers every request: may publish only to inboxes (responder.go)
	gate        *throttle.Gate     // rate limits on whoami and the seat tool (responder.go)
	gateStop    func()             // ends the gate's reports, the last one made
	vault       *vault.Vault
	vaultNC     *nats.Conn
	audit       *audit.Logger
	host        *host.Follower   // this node's declaration (hosting.go)
	supervisor  *host.Supervisor // the modules it runs
	sandbox     *sandbox.Sandbox // isolates its modules and builds (DESIGN §13)
	moduleUsers *sandbox.Users   // the uid each module runs as, when the node is root
	busUp       chan struct{}    // closed once the bus is open: what the supervisor fetches waits for it
	reportNow   chan struct{}    // the supervisor's state changed: report it
	logsSub     *nats.Subscription
	growSub     *nats.Subscription // a single node's grow tool
	certSub     *nats.Subscription // the cert-rotate tool
	statsSub    *nats.Subscription // the modules' tool latency reports (toolstats.go)
	toolStats   *moduleToolStats
	certs       *meshca.Keeper // the node's certificate, for routes and TLS clients (tls.go)
	certCA      *meshca.CA
	auditSub    *nats.Subscription
	dead        *deadletter.Writer
	members     *membership.Membership
	routeOf     map[string]string // member → host:port of the route this node was started with (form)
	// growGossip is a single node's gossip while it waits to grow into a mesh; growMu
	// serialises the growth's steps, growing is its progress, and restart makes Run end with
	// ErrRestart (grow.go).
	growGossip  *membership.Membership
	growStarted bool          // gossipToGrow ran (under growMu)
	growStop    chan struct{} // ends the count of growGossip's members
	growWG      sync.WaitGroup
	growMu      sync.Mutex
	growing     atomic.Pointer[string]
	restart     atomic.Bool
	regClosed   bool
	reg         *registry.Registry
	dir         *directory
	// dirComplete is closed once dir knows every key it will admit (the registry, the
	// vault's tokens and the seats are read): until then the bus holds an unknown key's
	// connect instead of refusing it (embedbus.Config.Complete).
	dirComplete chan struct{}
	quotas      quotas // modules over their EVENTS quota (quota.go)
	ctrl        *controller
	seats       *seatService
	clusterSubs []*nats.Subscription
	clusterWork *lifecycle.Group          // a leave or removal in progress: Close ends and waits for it
	eventConn   atomic.Pointer[nats.Conn] // set while open: gossip changes become node events on it
	left        atomic.Bool               // the node left its mesh
	quit        chan struct{}
	quitOnce    sync.Once
	httpLn      net.Listener
	httpSrv     *http.Server
	httpDone    chan struct{} // closed when the server ends (serveEarly); httpErr says how
	httpErr     error
	handlerNow  atomic.Pointer[http.Handler] // what it answers with: startHandler, then handler
	phase       atomic.Pointer[string]       // why the node is not ready yet while it opens
	// OnPhase is told each phase of the start as it begins ("" once open): what systemd's
	// STATUS says.
	OnPhase func(phase string)

	meter   *meter               // the node's counters and histograms, registered with metrics
	dash    *dashboard.Dashboard // the operator's console, opened with the HTTP API
	metrics *prometheus.Registry
}

// New returns a node for cfg; it opens nothing. A nil logger discards the log.
func New(cfg config.Config, log *slog.Logger) *Node {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Node{cfg: cfg, log: log.With("node", cfg.Name), rootLog: log, meter: newMeter()}
}

// startStep logs, at debug level, that a step of the start is done and how long after the
// start: where a slow start spends its time.
func (n *Node) startStep(step string) {
	n.log.Debug("start step done", "step", step, "after", time.Since(n.started).Round(time.Millisecond))
}

// Open is OpenContext without a way to cancel.
func (n *Node) Open() error { return n.OpenContext(context.Background()) }

// OpenContext validates the configuration and opens the node's parts in order — store and
// identity, HTTP listener, bus, the mesh's buckets and streams, vault and seats, audit,
// HTTP server — then writes node.json. On error everything opened is closed again. octx
// cancels the start at any point: the wait for a cluster's founding servers, the server's
// readiness and the JetStream phase.
func (n *Node) OpenContext(octx context.Context) (err error) {
	if err := n.cfg.Validate(); err != nil {
		return err
	}
	// Absolute: a module's process runs in its own directory, and is given paths under it.
	if n.cfg.DataDir, err = filepath.Abs(n.cfg.DataDir); err != nil {
		return fmt.Errorf("data dir %s: %w", n.cfg.DataDir, err)
	}
	n.started = time.Now()
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	keys, err := n.openIdentity()
	if err != nil {
		return err
	}
	if err := n.listenHTTP(); err != nil {
		return err
	}
	n.serveEarly()
	if err := n.newDirectory(&keys); err != nil {
		return err
	}
	// The modules this node ran start again now, from disk, before its bus waits for the
	// mesh — or, when the configuration does not fix the client port, as soon as the bus is
	// up (their MESH_URL is not known before).
	n.reportNow = make(chan struct{}, 1)
	if err := n.openSandbox(); err != nil {
		return err
	}
	n.newSupervisor()
	resumed := n.supervisor.URL != ""
	if resumed {
		n.resume(octx)
	}
	n.setPhase("starting the bus (a server of a mesh waits for its peers)")
	if err := n.openBus(octx, keys.responder); err != nil {
		return err
	}
	close(n.busUp)
	if err := n.openHost(); err != nil {
		return err
	}
	if !resumed {
		n.supervisor.URL = n.bus.ClientURL() // before any module starts: read by each start
		n.resume(octx)
	}
	if n.found.AwaitGrowth {
		if err := n.awaitGrowth(octx); err != nil {
			return err
		}
	}
	// The JetStream phase: buckets, streams, the mirrors' loads, seats. octx ends it too.
	n.setPhase("opening the mesh's streams, buckets, vault and seats")
	ctx, cancel := context.WithTimeout(octx, openTimeout)
	defer cancel()
	n.startStep("bus")
	leases, err := n.openMeshState(ctx, keys)
	if err != nil {
		return err
	}
	n.startStep("mesh state")
	if err := n.openServices(ctx, keys.vault, leases); err != nil {
		return err
	}
	n.startStep("services")
	close(n.dirComplete)
	if err := n.checkBuckets(ctx); err != nil {
		return err
	}
	if err := n.openAudit(); err != nil {
		return err
	}
	n.startStep("audit")
	if n.logsSub, err = n.serveLogs(); err != nil {
		return err
	}
	n.newHTTPServer()
	n.setPhase("")
	if err := n.announce(); err != nil {
		return err
	}
	info := n.info()
	info.ClientURL, info.HTTPURL = n.bus.ClientURL(), n.HTTPURL()
	if err := writeInfo(n.cfg.DataDir, info); err != nil {
		return fmt.Errorf("write %s: %w", InfoFile, err)
	}
	n.meter.startSeconds.Set(time.Since(n.started).Seconds())
	return nil
}

// partKeys are the keys of the node's own connections that open makes: the responder's,
// the dead-letter writer's and, on a node that holds the vault's credentials, the vault's.
type partKeys struct {
	responder, deadLetters nkeys.KeyPair
	vault                  nkeys.KeyPair // nil: this node does not serve the vault
	vaultPub               string
}

// openIdentity opens the store and loads the node's identity and foundation (minting them
// where CreateIdentity says so), refusing a node that left its mesh.
func (n *Node) openIdentity() (keys partKeys, err error) {
	if n.db, err = openStore(n.cfg.DataDir); err != nil {
		return keys, err
	}
	if n.Expect == 0 {
		n.Expect = 1
	}
	if n.id, n.found, err = loadIdentity(n.db, n.cfg.DataDir, n.cfg.Name, n.cfg.NameGiven, n.CreateIdentity, n.Expect); err != nil {
		return keys, err
	}
	if n.cfg.Name != n.id.Name {
		n.log = n.rootLog.With("node", n.id.Name)
		n.log.Info("the node's name is the data dir's", "host_default", n.cfg.Name)
		n.cfg.Name = n.id.Name
	}
	if err := checkNotLeft(n.db, n.id.Name); err != nil {
		return keys, err
	}
	n.quit = make(chan struct{})
	if n.key, err = n.found.NodeKey(); err != nil {
		return keys, err
	}
	if len(n.found.VaultSeed) > 0 {
		if keys.vault, err = n.found.VaultKey(); err != nil {
			return keys, err
		}
		keys.vaultPub, _ = keys.vault.PublicKey()
	}
	return keys, nil
}

// listenHTTP binds the HTTP listener before the bus starts, so a taken port costs no
// server start.
func (n *Node) listenHTTP() (err error) {
	if n.httpLn, err = net.Listen("tcp", n.cfg.HTTPAddr); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("listen on %s: %w; another process has it: stop it or set --http-addr", n.cfg.HTTPAddr, ErrHTTPAddrInUse)
		}
		return fmt.Errorf("listen on %s: %w; set --http-addr to an address this machine has", n.cfg.HTTPAddr, err)
	}
	return nil
}

// newDirectory makes the registry's mirror (empty until the bus is up) and the directory
// the bus authenticates against: the node's own keys, its parts' keys, and the registry.
func (n *Node) newDirectory(keys *partKeys) (err error) {
	n.reg = registry.New(n.log.With("component", "registry"), n.authorityChanged)
	n.dirComplete = make(chan struct{})
	respKey, respPub, respID, err := newPartIdentity("node-responder:"+n.id.Name, responderPermissions(n.id.Name))
	if err != nil {
		return err
	}
	n.quotas.over = map[string]api.Quota{}
	own := nodePermissions(n.id.Name)
	n.dir = &directory{
		node:   n.id.Name,
		static: map[string]embedbus.Identity{n.id.PublicKey: {Name: "node:" + n.id.Name, Permissions: &own, PublishDeny: nodeDeny()}, respPub: respID},
		reg:    n.reg,
		quotas: &n.quotas,
	}
	n.dir.vaultKey.Store(keys.vaultPub)
	n.dir.operator.Store(n.id.OperatorKey)
	deadKey, deadPub, deadID, err := newPartIdentity("node-dead-letters:"+n.id.Name, deadletter.WriterPermissions(partInbox("dead", n.id.Name)))
	if err != nil {
		return err
	}
	n.dir.static[deadPub] = deadID
	keys.responder, keys.deadLetters = respKey, deadKey
	return nil
}

// authorityChanged is the registry's change hook: a module whose authority changed is
// kicked, so it reconnects under its new grant, and so is the holder of a seat whose
// callers changed (it answers into their inboxes).
func (n *Node) authorityChanged(old, new *registry.Entry) {
	if authorityChanged(old, new) {
		kicked := n.bus.Kick(old.PublicKey)
		n.log.Info("module authority changed; its connections reconnect", "module", old.Module, "kicked", kicked)
	}
	// The holding instance on this node reconnects under the new grant, and holds on: its
	// lease stays.
	if s := n.dir.seats.Load(); s != nil {
		for _, seat := range seatsWithNewCallers(n.reg, old, new) {
			for _, l := range s.holders(seat) {
				if e, ok := n.reg.Get(l.Module); ok {
					kicked := n.bus.KickInstance(e.PublicKey, l.Instance)
					n.log.Info("a seat's callers changed; its holder reconnects", "seat", seat, "instance", l.Instance, "kicked", kicked)
				}
			}
		}
	}
}

// openBus starts the embedded server — forming the cluster first on a founding node that
// expects peers, migrating first on a single node growing into a mesh (grow.go) — and
// connects the responder.
func (n *Node) openBus(octx context.Context, respKey nkeys.KeyPair) (err error) {
	if err := n.openCerts(); err != nil {
		return err
	}
	if n.found.GrowTo == 0 {
		// A growth that ended between its last record and the removal of its copies.
		dir := filepath.Join(n.cfg.DataDir, growDir)
		if _, err := os.Stat(dir); err == nil {
			n.log.Info("removing what growing into a mesh left", "dir", dir)
			if err := os.RemoveAll(dir); err != nil {
				n.log.Warn("remove what growing left", "dir", dir, "err", err)
			}
		}
	}
	switch {
	case n.found.GrowTo > 0 && n.found.GrowPhase != growWaiting:
		if err := n.grow(octx); err != nil {
			return err
		}
	case n.found.Expect >= 3:
		forming := time.Now()
		cluster, err := n.form(octx)
		if err != nil {
			return err
		}
		n.meter.formSeconds.Set(time.Since(forming).Seconds())
		if err := n.startBus(octx, cluster, n.cfg.ClientAddr); err != nil {
			return err
		}
	default:
		if err := n.startBus(octx, nil, n.cfg.ClientAddr); err != nil {
			return err
		}
	}
	if n.respNC, err = n.bus.Connect(respKey, n.cfg.Name+"-responder"); err != nil {
		return fmt.Errorf("connect responder: %w", err)
	}
	n.budget = newStoreBudget(n.bus.MaxStore(), n.cfg)
	n.newGate()
	return nil
}

// startBus starts the embedded server on the node's store, clustered when cluster is set,
// with clients on clientAddr.
func (n *Node) startBus(octx context.Context, cluster *embedbus.Cluster, clientAddr string) (err error) {
	readyTimeout := embedbus.DefaultReadyTimeout
	if cluster != nil {
		readyTimeout = formationReadyTimeout
		cluster.TLS = n.certs.RouteTLS()
	}
	var clientTLS *tls.Config
	if n.clientTLSOn() {
		clientTLS = n.certs.ClientTLS()
	}
	n.bus, err = embedbus.Open(octx, embedbus.Config{
		Name:         n.cfg.Name,
		StoreDir:     filepath.Join(n.cfg.DataDir, jsDir),
		ClientAddr:   clientAddr,
		Logger:       n.log.With("component", "nats"),
		Key:          n.key,
		InboxPrefix:  nodeInbox(n.id.Name),
		Directory:    n.dir,
		Cluster:      cluster,
		ClientTLS:    clientTLS,
		ReadyTimeout: readyTimeout,
		Complete:     n.dirComplete,
		MaxStore:     int64(n.cfg.StoreMaxBytes),

		OnStartMemory:    n.OnStartMemory,
		StartMemoryLimit: n.StartMemoryLimit,
	})
	if errors.Is(err, embedbus.ErrAddrInUse) {
		return fmt.Errorf("%w; another process has it: stop it or set --client-addr", err)
	}
	if err != nil {
		return fmt.Errorf("open bus: %w", err)
	}
	return nil
}

// openMeshState makes the controller and brings the mesh's JetStream state to this node:
// the registry's and the leases' buckets and the mesh's streams (at once: in a new cluster
// each waits for its own raft group to elect a leader), the dead-letter writer, this node's
// identity in the registry, and every module's streams. The leases' store is returned for
// openServices.
func (n *Node) openMeshState(ctx context.Context, keys partKeys) (_ *seats.Store, err error) {
	n.ctrl = &controller{
		log:      n.log.With("component", "controller"),
		answered: n.meter.answered,
		nc:       n.bus.Conn(),
		resp:     n.respNC,
		gate:     n.gate,
		reg:      n.reg,
		quotas:   &n.quotas,
		topo: &topology{
			js:           n.bus.JetStream(),
			node:         n.id.Name,
			replicas:     n.replicas(),
			eventsMaxAge: time.Duration(n.cfg.EventsMaxAge),
			budget:       n.budget,
		},
		node:      n.id.Name,
		js:        n.bus.JetStream(),
		sweepNow:  make(chan struct{}, 1),
		reports:   newReportCounts(),
		hosts:     map[string]host.Report{},
		published: map[string]deploy.Declaration{},
		casc:      cascades{running: map[string]*cascade{}, lastCommit: map[string]string{}},
		prov:      provisions{interval: time.Duration(n.cfg.ProvisionInterval), wake: make(chan struct{}, 1)},
	}
	if n.ctrl.sign, err = envelope.NewSigningKey(n.key); err != nil {
		return nil, err
	}
	n.ctrl.publisher = &deploy.Publisher{JS: n.bus.JetStream(), Key: n.ctrl.sign, Controller: n.id.Name, Servers: n.serverKey}
	n.ctrl.epoch = func() uint64 { return 0 } // the seat's, once the leases are open (openSeats)
	var leases *seats.Store
	defer func() {
		if err != nil && leases != nil {
			leases.Close() // not yet handed to the seat service, which Close closes
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer n.startStep("registry")
		return retryJS(gctx, func(ctx context.Context) error {
			return n.reg.Open(ctx, n.bus.JetStream(), n.replicas(), n.budget.Registry)
		})
	})
	g.Go(func() error {
		defer n.startStep("leases")
		return retryJS(gctx, func(ctx context.Context) (err error) {
			leases, err = seats.OpenStore(ctx, n.bus.JetStream(), n.replicas(), seats.DefaultTTL, n.budget.Leases)
			if err == nil {
				leases.SetLogger(n.log.With("component", "seats"))
				leases.OnHolderChange(n.meter.holderChanged)
			}
			return err
		})
	})
	g.Go(func() error {
		defer n.startStep("mesh streams")
		return retryJS(gctx, n.ctrl.topo.ensureMesh)
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if n.dead, err = n.openDeadLetters(keys.deadLetters); err != nil {
		return nil, err
	}
	if err := n.publishIdentity(ctx, keys.vaultPub); err != nil {
		return nil, err
	}
	n.startStep("identity")
	if err := retryJS(ctx, n.ctrl.reconcileAll); err != nil {
		return nil, fmt.Errorf("reconcile topology: %w", err)
	}
	n.startStep("topology")
	return leases, nil
}

// publishIdentity records this node's keys in the registry, and the vault's key on the node
// that holds it: what modules check node and vault signatures against.
func (n *Node) publishIdentity(ctx context.Context, vaultPub string) error {
	xkp, err := n.found.NodeXKey()
	if err != nil {
		return err
	}
	xpub, _ := xkp.PublicKey()
	if err := retryJS(ctx, func(ctx context.Context) error {
		return n.reg.SetNode(ctx, n.id.Name, registry.NodeIdentity{PublicKey: n.id.PublicKey, XKey: xpub})
	}); err != nil {
		return err
	}
	if vaultPub == "" {
		return nil
	}
	return retryJS(ctx, func(ctx context.Context) error { return n.reg.SetVault(ctx, vaultPub) })
}

// openServices starts what the node serves: the vault (only a node with the vault's
// credentials: the genesis node, until enrolment delivers the barrier key to others), the
// seat service with the mesh's own seats, and the handoff of a previous holder's work.
func (n *Node) openServices(ctx context.Context, vaultKey nkeys.KeyPair, leases *seats.Store) (err error) {
	defer func() {
		if err != nil && n.seats == nil {
			leases.Close() // not handed to the seat service, which Close closes
		}
	}()
	if vaultKey != nil {
		if err := n.openVault(ctx, vaultKey); err != nil {
			return err
		}
	}
	if err := n.openSeats(ctx, leases); err != nil {
		return err
	}
	return n.handOff(ctx)
}

// checkBuckets raises an alarm for a registry or vault bucket this node has known and finds
// lost: not an empty mesh (drift.go). Only the genesis node marks the buckets (at the mesh's
// first start, and for a mesh from before markers): a node that joined cannot tell a new
// bucket from a lost one made again, and its mark would clear the others' alarm. It also
// reports bad records and serves api.NodeToolAcceptLoss.
func (n *Node) checkBuckets(ctx context.Context) (err error) {
	known := knowsBuckets(n.db)
	_, genesisErr := genesis.New(n.db).Record()
	mayMark := func(string) bool { return genesisErr == nil }
	if err := retryJS(ctx, func(ctx context.Context) error { return n.checkKept(ctx, known, mayMark) }); err != nil {
		return fmt.Errorf("check the mesh's buckets: %w", err)
	}
	if !known {
		if err := markBucketsKnown(n.db); err != nil {
			return err
		}
	}
	n.checkBadRecords()
	if n.lossSub, err = n.serveAcceptLoss(); err != nil {
		return fmt.Errorf("serve %s: %w", api.NodeToolAcceptLoss, err)
	}
	return nil
}

// newHTTPServer makes the metrics and the HTTP API, which the server (serving since Open
// bound its listener) answers with from now on.
func (n *Node) newHTTPServer() {
	n.metrics = newMetrics(n.started, func() *embedbus.Bus { return n.bus },
		func() api.NodeAuditStatus { return n.auditStatus(context.Background()) },
		func() uint64 { // not auditStatus: its JetStream requests are not needed for a counter
			if n.audit == nil {
				return 0
			}
			return n.audit.Missed()
		},
		func() int64 {
			if st, err := os.Stat(filepath.Join(n.cfg.DataDir, storeFile)); err == nil {
				return st.Size()
			}
			return 0
		})
	n.metrics.MustRegister(n.ctrl.reports)
	n.metrics.MustRegister(n.meter.collectors()...)
	n.metrics.MustRegister(&streamCollector{bus: func() *embedbus.Bus { return n.bus }})
	n.toolStats = newModuleToolStats(n.id.Name, func(module, tool string) bool {
		e, ok := n.reg.Get(module)
		return ok && declaresTool(e.Manifest, tool)
	})
	n.metrics.MustRegister(n.toolStats)
	n.dash = n.openDashboard()
	h := n.handler()
	n.handlerNow.Store(&h)
}

// announce serves the cluster's tools and tells the mesh this node joined, on a node with
// peers.
func (n *Node) announce() (err error) {
	if n.certSub, err = n.serveCertRotate(); err != nil {
		return fmt.Errorf("serve the cert-rotate tool: %w", err)
	}
	if n.statsSub, err = n.bus.Conn().Subscribe(manifest.StatsSubject("*", n.id.Name), n.toolStats.take); err != nil {
		return fmt.Errorf("take the modules' tool latency: %w", err)
	}
	if n.members == nil {
		// A single node: it may grow into a mesh.
		if n.growSub, err = n.serveGrow(); err != nil {
			return fmt.Errorf("serve the grow tool: %w", err)
		}
		if n.found.GrowPhase == growWaiting {
			return n.gossipToGrow()
		}
		return nil
	}
	n.clusterWork = lifecycle.NewGroup(context.Background())
	if n.clusterSubs, err = n.serveCluster(); err != nil {
		return fmt.Errorf("serve cluster tools: %w", err)
	}
	gone, err := n.dropRoutesOfGone()
	if err != nil {
		return fmt.Errorf("watch for servers gone: %w", err)
	}
	n.clusterSubs = append(n.clusterSubs, gone)
	publishNodeEvent(n.bus.Conn(), n.key, n.id.Name, "joined", map[string]any{
		"node": n.id.Name, "mesh_id": n.id.MeshID, "client_url": n.bus.ClientURL(), "cluster_addr": n.cfg.ClusterAddr,
	}, n.log)
	n.eventConn.Store(n.bus.Conn())
	n.reportUnreachable() // if this node took mesh-controller while opening
	return nil
}

// actorDone is what an actor's end means: nil when its context ended (a stop), an error
// naming it otherwise — its own, or that it stopped unexpectedly.
func actorDone(ctx context.Context, name string, err error) error {
	switch {
	case ctx.Err() != nil:
		return nil
	case err == nil:
		return fmt.Errorf("%s: stopped unexpectedly", name)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// Run runs the node's actors until ctx ends, a signal arrives (with HandleSignals) or an
// actor fails. A requested stop returns nil. Run does not close the node: call Close.
func (n *Node) Run(ctx context.Context) error {
	var g run.Group
	{
		ctx, cancel := context.WithCancel(ctx)
		g.Add(func() error {
			select {
			case <-ctx.Done():
			case <-n.quit: // the node left its mesh
			}
			return nil
		}, func(error) { cancel() })
	}
	if n.HandleSignals {
		g.Add(run.SignalHandler(ctx, os.Interrupt, syscall.SIGTERM))
	}
	// Each actor runs until its context ends; one that returns before, even without an error,
	// stopped unexpectedly: the group ends, and the error names it.
	add := func(name string, f func(ctx context.Context) error) {
		ctx, cancel := context.WithCancel(ctx)
		g.Add(func() error { return actorDone(ctx, name, f(ctx)) }, func(error) { cancel() })
	}
	add("registry watch", n.reg.Run)
	add("leases watch", n.seats.store.Watch)
	if n.vault != nil {
		add("vault watch", n.vault.Watch)
	} else {
		// A server without the vault's credentials asks for them, then serves the vault too.
		add("vault enrolment", n.enrolVault)
	}
	add("audit logger", n.audit.Run)
	add("declaration follower", n.host.Run)
	add("reports", n.runReports)
	add("drift check", n.watchDrift)
	add("quotas", n.enforceQuotas)
	add("certificate renewal", n.renewCerts)
	g.Add(func() error {
		// Served since Open bound it (serveEarly): this waits for it to end.
		<-n.httpDone
		if err := n.httpErr; !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	}, func(error) {
		n.dash.Close() // its event streams never go idle: Shutdown would wait them out
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(n.cfg.ShutdownTimeout)/2)
		defer cancel()
		n.httpSrv.Shutdown(ctx)
	})

	n.log.Info("node running", "client_url", n.bus.ClientURL(), "http", n.HTTPURL(), "mesh_id", n.id.MeshID)
	err := g.Run()
	if errors.Is(err, run.ErrSignal) {
		n.log.Info("stopping", "reason", err.Error())
		return nil
	}
	if err == nil && n.restart.Load() {
		return ErrRestart
	}
	return err
}

// Close closes the node's parts in reverse order and removes node.json. It keeps the first
// error and is safe to call on a partly opened node.
func (n *Node) Close() error {
	var first error
	keep := func(err error, part string) {
		if err != nil && first == nil {
			first = fmt.Errorf("close %s: %w", part, err)
		}
	}
	keep(n.dash.Close(), "dashboard")
	if n.httpSrv != nil {
		keep(n.httpSrv.Close(), "http")
		<-n.httpDone
	} else if n.httpLn != nil {
		keep(n.httpLn.Close(), "http")
	}
	if n.supervisor != nil {
		n.supervisor.Stop() // the modules stop with their node
	}
	keep(n.sandbox.Close(), "sandbox")
	n.eventConn.Store(nil)
	if n.lossSub != nil {
		n.lossSub.Unsubscribe()
		n.lossSub = nil
	}
	for _, s := range n.clusterSubs {
		s.Unsubscribe()
	}
	n.clusterSubs = nil
	if n.clusterWork != nil {
		n.clusterWork.Close()
	}
	if n.members != nil && n.bus != nil && !n.left.Load() {
		publishNodeEvent(n.bus.Conn(), n.key, n.id.Name, "stopped", map[string]any{"node": n.id.Name}, n.log)
		n.bus.Conn().FlushTimeout(time.Second)
	}
	if n.dead != nil {
		keep(n.dead.Close(), "dead letters")
		n.dead = nil
	}
	if n.auditSub != nil {
		n.auditSub.Unsubscribe()
		n.auditSub = nil
	}
	if n.logsSub != nil {
		n.logsSub.Unsubscribe()
		n.logsSub = nil
	}
	if n.growSub != nil {
		n.growSub.Unsubscribe()
		n.growSub = nil
	}
	if n.statsSub != nil {
		n.statsSub.Unsubscribe()
		n.statsSub = nil
	}
	if n.certSub != nil {
		n.certSub.Unsubscribe()
		n.certSub = nil
	}
	if n.seats != nil {
		n.seats.stop()
		keep(n.seats.store.Close(), "seats")
		n.seats = nil
	}
	if n.ctrl != nil {
		n.ctrl.close()
		n.ctrl = nil
	}
	if n.vault != nil {
		keep(n.vault.Close(), "vault")
		n.vault = nil
	}
	if n.vaultNC != nil {
		n.vaultNC.Close()
		n.vaultNC = nil
	}
	if n.reg != nil && !n.regClosed {
		// The pointer stays: closures handed to other parts (the audit logger's key lookup)
		// may still read the last mirror.
		keep(n.reg.Close(), "registry")
		n.regClosed = true
	}
	if n.gateStop != nil {
		n.gateStop()
		n.gateStop = nil
	}
	if n.respNC != nil {
		n.respNC.Close()
		n.respNC = nil
	}
	if n.bus != nil {
		keep(n.bus.Close(), "bus")
		n.bus = nil
	}
	if m := n.growMembers(); m != nil {
		n.growMu.Lock()
		close(n.growStop)
		n.growMu.Unlock()
		n.growWG.Wait()
		keep(m.Stop(time.Second), "membership")
		n.growMu.Lock()
		n.growGossip = nil
		n.growMu.Unlock()
	}
	if n.members != nil {
		keep(n.members.Stop(time.Second), "membership")
		n.members = nil
	}
	if n.db != nil {
		removeInfo(n.cfg.DataDir)
		keep(n.db.Close(), "store")
		n.db = nil
	}
	return first
}

// enrolVault asks the vault for its own credentials, sealed to this node's xkey, keeps them
// in the store, opens the vault here and becomes a candidate for its seat; then it follows
// the vault's records until ctx ends.
func (n *Node) enrolVault(ctx context.Context) error {
	xkp, err := n.found.NodeXKey()
	if err != nil {
		return err
	}
	xpub, _ := xkp.PublicKey()
	var out api.ServerSecrets
	wait := backoff.Backoff{First: 500 * time.Millisecond, Max: 10 * time.Second}
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := vault.CallWith(actx, n.bus.Conn(), xkp, api.VaultVerbServer, api.VaultCallerNode, api.VaultRequest{XKey: xpub, Node: n.id.Name}, &out)
		cancel()
		if err == nil {
			break
		}
		n.log.Debug("waiting for the vault's credentials", "err", err)
		if wait.Wait(ctx) != nil {
			return nil
		}
	}
	n.found.BarrierKey, n.found.VaultSeed = out.BarrierKey, out.VaultSeed
	if err := genesis.New(n.db).Keep(n.found); err != nil {
		return fmt.Errorf("keep the vault's credentials: %w", err)
	}
	key, err := n.found.VaultKey()
	if err != nil {
		return err
	}
	pub, _ := key.PublicKey()
	n.dir.vaultKey.Store(pub)
	if err := n.openVault(ctx, key); err != nil {
		return err
	}
	n.seats.vault = n.vault
	if n.cfg.Holds(manifest.VaultSeat) {
		n.seats.run.Add(seats.Candidate{Seat: manifest.VaultSeat, Scope: manifest.ScopeMesh, Instance: n.id.Name})
	}
	n.log.Info("this server holds the vault's credentials and can serve the vault")
	return n.vault.Watch(ctx)
}

// retryJS runs f with a fresh context until it succeeds or ctx ends. A clustered JetStream
// drops an API request sent while it has no leader for the asset (the meta group's, or a new
// stream's) — the request is never answered — so a step of Open asks again rather than wait
// out its whole budget on one lost request. The first attempts are short (an answered request
// takes milliseconds; a dropped one would cost the whole attempt), later ones longer (a
// stream placed on a busy cluster can take seconds to answer).
func retryJS(ctx context.Context, f func(context.Context) error) error {
	attempt := 250 * time.Millisecond
	pause := backoff.Backoff{First: 20 * time.Millisecond, Max: 2 * time.Second}
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err := f(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !retryableJS(err) {
			return err
		}
		attempt = min(2*attempt, 5*time.Second)
		if pause.Wait(ctx) != nil {
			return err
		}
	}
}

// retryableJS reports whether a JetStream request's error is one a clustered JetStream gives
// while it settles (no leader yet, no peers placed yet, a peer change in flight), told by type
// and by nats-server's error code, never by text.
func retryableJS(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, embedbus.ErrChangeInFlight) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch server.ErrorIdentifier(apiErr.ErrorCode) {
		case server.JSClusterNotAvailErr, server.JSClusterNoPeersErrF, server.JSClusterNotLeaderErr:
			return true
		case server.JSStreamNameExistErr:
			// Two nodes created a stream at once with configurations that differ (each sizes
			// the mesh's streams from its own store): asked again, the update path settles it.
			return true
		}
	}
	return false
}

// openSeats takes the lease store, starts the node's seat tool, and takes the mesh's own
// seats this node is a candidate for before the node reports ready.
func (n *Node) openSeats(ctx context.Context, store *seats.Store) error {
	s := &seatService{
		log: n.log.With("component", "seats"), node: n.id.Name, key: n.key,
		bus: n.bus, resp: n.respNC, gate: n.gate, reg: n.reg, topo: n.ctrl.topo, store: store, ctrl: n.ctrl, vault: n.vault,
	}
	s.run = seats.NewRunner(store, n.id.Name, s.log, s.alive, s.hooks())
	s.onControl = n.reportUnreachable
	n.seats = s
	n.dir.seats.Store(s)
	n.ctrl.seats = s.status
	n.ctrl.epoch = func() uint64 {
		// The runner's own record of the lease it holds: the lease bucket's mirror can lag.
		l, _ := s.run.Holds(seats.Candidate{Seat: manifest.ControllerSeat, Scope: manifest.ScopeMesh, Instance: n.id.Name})
		return l.Epoch
	}
	if err := s.start(); err != nil {
		return err
	}
	// The mesh's own seats this node's configuration makes it a candidate for.
	if n.cfg.Holds(manifest.ControllerSeat) {
		s.run.Add(seats.Candidate{Seat: manifest.ControllerSeat, Scope: manifest.ScopeMesh, Instance: n.id.Name})
	}
	if n.vault != nil && n.cfg.Holds(manifest.VaultSeat) {
		s.run.Add(seats.Candidate{Seat: manifest.VaultSeat, Scope: manifest.ScopeMesh, Instance: n.id.Name})
	}
	// The cascade's seats, on the nodes configured for them (a module declaring one instead
	// holds it as its own).
	if err := n.openBuildSeats(s); err != nil {
		return err
	}
	if _, declared := n.reg.Declarer(build.GitSeat); len(n.cfg.GitRepos) > 0 && !declared {
		s.run.Add(seats.Candidate{Seat: build.GitSeat, Scope: manifest.ScopeMesh, Instance: n.id.Name})
	}
	if _, declared := n.reg.Declarer(build.BuilderSeat); n.cfg.Builder && !declared {
		s.run.Add(seats.Candidate{Seat: build.BuilderSeat, Scope: manifest.ScopeMesh, Instance: n.id.Name})
	}
	s.run.Acquire(ctx)
	// The runner renews from here on, not from Run: what Open does next (the genesis
	// hand-off) can take longer than a lease lives. It releases every lease when it stops
	// (Close), so a graceful stop hands this node's seats on at once.
	s.runLeases()
	return nil
}

// openVault opens the vault on its own bus identity, with the barrier key from the store.
func (n *Node) openVault(ctx context.Context, key nkeys.KeyPair) (err error) {
	if n.vaultNC, err = n.bus.Connect(key, "vault", nats.CustomInboxPrefix(partInbox("vault", n.id.Name))); err != nil {
		return fmt.Errorf("connect vault: %w", err)
	}
	err = retryJS(ctx, func(ctx context.Context) (err error) {
		n.vault, err = vault.Open(ctx, vault.Config{
			Log:         n.log.With("component", "vault"),
			MeshID:      n.id.MeshID,
			Node:        n.id.Name,
			Conn:        n.vaultNC,
			Responder:   n.respNC,
			Key:         key,
			BarrierKey:  n.found.BarrierKey,
			Replicas:    n.replicas(),
			MaxBytes:    n.budget.Vault,
			RateLimit:   n.cfg.RateLimit,
			Served:      n.meter.served,
			RateLimited: n.meter.rateLimited,
			Secrets: func(module string) ([]string, bool) {
				e, ok := n.reg.Get(module)
				if !ok {
					return nil, false
				}
				return e.Manifest.Secrets, true
			},
			Enrolment: n.enrolment,
			Admit: func(name string) error {
				if _, taken := n.reg.Node(name); taken {
					return fmt.Errorf("mesh %s has a server named %s already: join with another --name (a name is a server's raft identity)", n.id.MeshID, name)
				}
				return nil
			},
			Addrs: n.clientAddrs,
			ServerXKey: func(node string) (string, bool) {
				id, ok := n.reg.Node(node)
				return id.XKey, ok && id.XKey != ""
			},
			Declared: n.declared,
		})
		return err
	})
	if err != nil {
		return err
	}
	n.dir.vault.Store(n.vault)
	return nil
}

// openHost reads the declaration this node applied last and makes the follower of its next
// ones: signed by a server of the mesh, checked against the registry's node keys.
func (n *Node) openHost() (err error) {
	n.host, err = host.Open(host.Config{
		Node: n.id.Name, DB: n.db, JS: n.bus.JetStream(), Log: n.log.With("component", "host"),
		Servers: func(name string) (string, bool) {
			id, ok := n.reg.Node(name)
			return id.PublicKey, ok
		},
		Event: func(name string, meta map[string]any) {
			publishNodeEvent(n.bus.Conn(), n.key, n.id.Name, name, meta, n.log)
		},
		Apply: n.apply,
		Holder: func() (string, uint64, time.Time, bool) {
			if n.seats == nil {
				return "", 0, time.Time{}, false
			}
			l, ok := n.seats.store.Get(seats.Key(manifest.ControllerSeat, manifest.ScopeMesh, ""))
			return l.Node, l.Epoch, l.Since, ok
		},
	})
	return err
}

// openAudit opens the audit logger on the node's store and serves its tool.
func (n *Node) openAudit() (err error) {
	keys := func(subject, source string) (string, bool) {
		if ns, owner, _, ok := manifest.SplitSubject(subject); ok && ns == "seat" && owner == source && source != manifest.VaultSeat {
			// The cascade's seats, held by a node, sign with the holding node's key.
			if (source == build.GitSeat || source == build.BuilderSeat) && n.seats != nil {
				if l, ok := n.seats.store.Get(seats.Key(source, manifest.ScopeMesh, "")); ok && l.Module == "" {
					if id, ok := n.reg.Node(l.Node); ok {
						return id.PublicKey, true
					}
				}
			}
			// A seat's event is signed by its holder: an instance of the declaring module.
			if e, ok := n.reg.Declarer(source); ok {
				return e.PublicKey, true
			}
			return "", false
		}
		switch source {
		case n.id.Name:
			return n.id.PublicKey, true
		case manifest.VaultSeat:
			pub := n.reg.Vault()
			return pub, pub != ""
		}
		if e, ok := n.reg.Get(source); ok {
			return e.PublicKey, true
		}
		if id, ok := n.reg.Node(source); ok {
			return id.PublicKey, true // another server of the mesh
		}
		return "", false
	}
	n.audit, err = audit.New(n.db, n.bus.JetStream(), n.id.Name, keys, n.owns, time.Duration(n.cfg.AuditRetention), n.log.With("component", "audit"))
	if err != nil {
		return err
	}
	n.audit.SetEventsMaxAge(time.Duration(n.cfg.EventsMaxAge))
	n.audit.Ingested = n.meter.ingested
	n.auditSub, err = audit.Serve(n.respNC, n.id.Name, n.audit)
	return err
}

// owns reports whether source may speak for the owner of subject's namespace: a module for
// its own events, a node for its own, a seat's declarer (or the mesh, for its own seats)
// for the seat's.
func (n *Node) owns(subject, source string) bool {
	kind, owner, _, ok := manifest.SplitSubject(subject)
	if !ok {
		return false
	}
	switch kind {
	case "mod":
		return source == owner
	case "node":
		// A server speaks for itself, and for another it saw fail or removed.
		_, server := n.reg.Node(source)
		return source == owner || server
	case "seat":
		if source == owner {
			return true
		}
		e, ok := n.reg.Get(source)
		if !ok {
			return false
		}
		_, declares := e.Manifest.Seat(owner)
		return declares
	}
	return false
}

// handOff completes genesis: the vault, now serving, mints the operator's credential, and
// genesis records that it has handed off and will mint nothing more.
func (n *Node) handOff(ctx context.Context) error {
	g := genesis.New(n.db)
	r, err := g.Record()
	if errors.Is(err, genesis.ErrNone) || (err == nil && !r.HandedOff.IsZero()) {
		return nil // enrolled, or handed off already
	}
	if err != nil {
		return err
	}
	if !n.cfg.Holds(manifest.VaultSeat) {
		return fmt.Errorf("genesis hand-off: this node founds the mesh and holds the vault's credentials, so it must serve the vault until the hand-off is done: add %s to mesh-seats", manifest.VaultSeat)
	}
	var id api.Identity
	if _, err := vault.Call(ctx, n.bus.Conn(), api.VaultVerbIdentity, api.VaultCallerNode, api.VaultRequest{Owner: api.VaultCallerOperator}, &id); err != nil {
		return fmt.Errorf("genesis hand-off: the vault could not mint the operator credential: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(n.cfg.DataDir, OperatorSeedFile), []byte(id.Seed+"\n"), 0o600); err != nil {
		return fmt.Errorf("write operator seed: %w", err)
	}
	if err := keepOperator(n.db, id.PublicKey); err != nil {
		return err
	}
	n.id.OperatorKey = id.PublicKey
	n.dir.operator.Store(id.PublicKey)
	if err := n.reg.SetOperator(ctx, id.PublicKey); err != nil {
		return err
	}
	if err := g.HandOff(); err != nil {
		return err
	}
	n.log.Info("genesis handed off to the vault", "mesh_id", n.id.MeshID, "operator_key", id.PublicKey)
	return nil
}

// requestStop ends Run: the node has left its mesh.
func (n *Node) requestStop() { n.quitOnce.Do(func() { close(n.quit) }) }

// Identity returns the node's identity.
func (n *Node) Identity() Identity { return n.id }

// ClientURL is the NATS URL of the node's bus.
func (n *Node) ClientURL() string { return n.bus.ClientURL() }

// HTTPURL is the base URL of the node's HTTP API.
func (n *Node) HTTPURL() string {
	if n.httpLn == nil {
		return ""
	}
	return "http://" + n.httpLn.Addr().String()
}

// HasVault reports whether this node holds the vault's credentials (and can serve it).
func (n *Node) HasVault() bool {
	pub, _ := n.dir.vaultKey.Load().(string)
	return pub != ""
}

// Bus is the node's embedded bus.
func (n *Node) Bus() *embedbus.Bus { return n.bus }
