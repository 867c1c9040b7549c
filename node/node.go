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
	"syscall"
	"time"

	"github.com/meshnode/meshnode/admit"
	"github.com/meshnode/meshnode/alarm"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/controller"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/deadletter"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/formats"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/internal/lifecycle"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/metrics"
	"github.com/meshnode/meshnode/provenance"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/replication"
	"github.com/meshnode/meshnode/seats"
	"github.com/meshnode/meshnode/site"
	"github.com/meshnode/meshnode/snapshot"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
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
func (n *Node) replicas() int { return replication.Target(n.servers()) }

// servers is how many servers the mesh has as this node knows it (replication.Count); one
// for a standalone server, whatever its registry says.
func (n *Node) servers() int {
	if n.count == nil || n.bus == nil || !n.bus.Clustered() {
		return 1
	}
	return n.count.Servers()
}

// replicationServers is what the replication keeper counts (replication.Known).
func (n *Node) replicationServers() int {
	return replication.Known(n.servers(), len(n.bus.Peers()), n.bus.Clustered(), n.bus.JetStreamDisabled() == nil)
}

// Errors of Open.
var (
	// ErrHTTPAddrInUse is returned by Open when the HTTP address is taken.
	ErrHTTPAddrInUse = errors.New("http address already in use")
)

// Options are what a caller sets on a Node before Open, besides its configuration.
type Options struct {
	// CreateIdentity runs genesis — a new mesh with this node as its first — when the data
	// dir holds no mesh; without it Open refuses an empty data dir.
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
	// OnPhase is told each phase of the start as it begins ("" once open): what systemd's
	// STATUS says.
	OnPhase func(phase string)
	// Formats stands in for this binary's formats (formats.All) in what the node tells the
	// others: a test's newer or older meshnode. Nil: the binary's own.
	Formats map[string]formats.Version
}

// Node is one meshnode: the composition root. It opens its parts in order — store and
// identity, HTTP listener, sandbox and supervisor, bus, the mesh's buckets and streams,
// controller, vault and seats, audit, HTTP API — pushing how to close each on closers, so
// Close (and a failed Open) undoes exactly the steps taken, the last first. It keeps only
// what wires the parts together.
type Node struct {
	Options // set before Open

	cfg     config.Config
	log     *slog.Logger // with the node's name
	rootLog *slog.Logger // as New was given it: log again once the data dir names the node
	started time.Time
	closers lifecycle.Stack // how to close each part opened, in the order opened

	// The data dir's: the store, the node's identity, its foundation and keys.
	db    *bolt.DB
	id    datadir.Identity
	found *genesis.Foundation
	key   nkeys.KeyPair
	sign  *envelope.SigningKey // key, expanded: what the node signs its events and jobs with

	bus     *embedbus.Bus
	budget  controller.Budget // the byte limits of the mesh's streams and buckets on this node
	alarms  alarm.Set         // standing reasons not to be ready (drift.go, snapshots)
	resp    responder         // answers every request (responder.go)
	reg     *registry.Registry
	count   *replication.Count // the mesh's servers (servers)
	dir     *directory         // what the bus authenticates against (directory.go)
	ctrl    *controller.Controller
	seats   *seatService
	vault   *vault.Vault // nil on a server without the vault's credentials
	vaultNC *nats.Conn   // the vault's own connection
	audit   *audit.Logger
	admit   *admit.Admitter // what modules publish to a stream passes it (admit.go)
	mods    hosting         // the modules this node runs (hosting.go)
	tls     certs           // the node's certificate, for routes and TLS clients (tls.go)
	mesh    clusterPart     // this server's place in its mesh (cluster.go)
	grower  grower          // a single node growing into a mesh (grow.go)
	quit    stopSignal      // the node left its mesh: Run ends
	web     front           // the HTTP listener, server and dashboard (http.go)
	metrics observed        // the node's metrics
}

// observed is the node's metrics: its Prometheus registry and the counters parts report to.
type observed struct {
	reg   *prometheus.Registry
	meter *metrics.Meter
}

// stopSignal asks Run to end, once.
type stopSignal struct {
	ch   chan struct{}
	once sync.Once
}

// New returns a node for cfg; it opens nothing. A nil logger discards the log.
func New(cfg config.Config, log *slog.Logger) *Node {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Node{cfg: cfg, log: log.With("node", cfg.Name), rootLog: log, metrics: observed{meter: metrics.NewMeter()}}
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
	n.closers.Push("http", n.closeHTTP)
	if err := n.newDirectory(&keys); err != nil {
		return err
	}
	// The modules this node ran start again now, from disk, before its bus waits for the
	// mesh — or, when the configuration does not fix the client port, as soon as the bus is
	// up (their MESH_URL is not known before).
	n.mods.reportNow = make(chan struct{}, 1)
	if err := n.openSandbox(); err != nil {
		return err
	}
	n.newSupervisor()
	resumed := n.mods.supervisor.URL != ""
	if resumed {
		n.resume(octx)
	}
	n.setPhase("starting the bus (a server of a mesh waits for its peers)")
	if err := n.openBus(octx, keys.responder); err != nil {
		return err
	}
	close(n.mods.busUp)
	if err := n.openHost(); err != nil {
		return err
	}
	if !resumed {
		n.mods.supervisor.URL = n.bus.ClientURL() // before any module starts: read by each start
		n.resume(octx)
	}
	if err := snapshot.Resume(octx, n.db, n.cfg.DataDir, n.found, n.bus, n.replicas(), n.setPhase, n.log); err != nil {
		return err // a mesh restored from a snapshot (genesis --from-snapshot): its streams first
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
	close(n.dir.complete)
	if err := n.checkBuckets(ctx); err != nil {
		return err
	}
	if err := n.openAudit(); err != nil {
		return err
	}
	if err := n.openAdmitter(keys.admitter); err != nil {
		return err
	}
	n.startStep("audit")
	if err := n.subscribe("logs tool", n.serveLogs); err != nil {
		return err
	}
	if err := n.subscribe("status tool", n.serveStatus); err != nil {
		return err
	}
	if err := n.subscribe("members tool", n.serveMembers); err != nil {
		return err
	}
	if err := n.newHTTPServer(); err != nil {
		return err
	}
	n.setPhase("")
	if err := n.announce(); err != nil {
		return err
	}
	// What the outside reaches stops first: the dashboard, the HTTP API, then the modules,
	// while the bus still serves their goodbyes. Pushed when each opened (for a failed
	// Open), and again now, last; each of these closes may run twice.
	n.closers.PushFunc("modules", n.mods.supervisor.Stop)
	n.closers.Push("http", n.closeHTTP)
	n.closers.Push("dashboard", n.web.dash.Close)
	info := n.info()
	info.ClientURL, info.HTTPURL = n.bus.ClientURL(), n.HTTPURL()
	if err := datadir.WriteInfo(n.cfg.DataDir, info); err != nil {
		return fmt.Errorf("write %s: %w", datadir.InfoFile, err)
	}
	n.metrics.meter.StartSeconds.Set(time.Since(n.started).Seconds())
	return nil
}

// partKeys are the keys of the node's own connections that open makes: the responder's,
// the dead-letter writer's, the admitter's and, on a node that holds the vault's credentials,
// the vault's.
type partKeys struct {
	responder, deadLetters nkeys.KeyPair
	admitter               nkeys.KeyPair
	vault                  nkeys.KeyPair // nil: this node does not serve the vault
	vaultPub               string
}

// openIdentity opens the store and loads the node's identity and foundation (minting them
// where CreateIdentity says so), refusing a node that left its mesh.
func (n *Node) openIdentity() (keys partKeys, err error) {
	if n.db, err = datadir.Open(n.cfg.DataDir); err != nil {
		return keys, err
	}
	n.closers.Push("store", func() error {
		datadir.RemoveInfo(n.cfg.DataDir)
		return n.db.Close()
	})
	n.closers.Push("growth", n.grower.close) // its gossip, if a grow request opens one
	if n.Expect == 0 {
		n.Expect = 1
	}
	if n.id, n.found, err = datadir.LoadIdentity(n.db, n.cfg.DataDir, n.cfg.Name, n.cfg.NameGiven, n.CreateIdentity, n.Expect); err != nil {
		return keys, err
	}
	n.count = replication.NewCount(n.db, func() int { return n.found.Expect }, func() int {
		if n.reg == nil {
			return 0
		}
		return len(n.reg.Nodes())
	}, n.log)
	if n.cfg.Name != n.id.Name {
		n.log = n.rootLog.With("node", n.id.Name)
		n.log.Info("the node's name is the data dir's", "host_default", n.cfg.Name)
		n.cfg.Name = n.id.Name
	}
	if err := checkNotLeft(n.db, n.id.Name); err != nil {
		return keys, err
	}
	n.quit.ch = make(chan struct{})
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
	if n.web.ln, err = net.Listen("tcp", n.cfg.HTTPAddr); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("listen on %s: %w; another process has it: stop it or set --http-addr", n.cfg.HTTPAddr, ErrHTTPAddrInUse)
		}
		return fmt.Errorf("listen on %s: %w; set --http-addr to an address this machine has", n.cfg.HTTPAddr, err)
	}
	if meshca.HTTPS(n.cfg.HTTPAddr) { // beyond loopback: HTTPS, once the node has its certificate
		n.web.ln = tls.NewListener(n.web.ln, n.web.certs.ServerTLS())
	}
	return nil
}

// newDirectory makes the registry's mirror (empty until the bus is up) and the directory
// the bus authenticates against: the node's own keys, its parts' keys, and the registry.
func (n *Node) newDirectory(keys *partKeys) (err error) {
	n.reg = registry.New(n.log.With("component", "registry"), n.authorityChanged)
	respKey, respPub, respID, err := newPartIdentity("node-responder:"+n.id.Name, responderPermissions(n.id.Name))
	if err != nil {
		return err
	}
	own := nodePermissions(n.id.Name)
	n.dir = &directory{
		node:     n.id.Name,
		static:   map[string]embedbus.Identity{n.id.PublicKey: {Name: "node:" + n.id.Name, Permissions: &own, PublishDeny: nodeDeny()}, respPub: respID},
		reg:      n.reg,
		complete: make(chan struct{}),
	}
	n.dir.vaultKey.Store(keys.vaultPub)
	n.dir.operator.Store(n.id.OperatorKey)
	deadKey, deadPub, deadID, err := newPartIdentity("node-dead-letters:"+n.id.Name, deadletter.WriterPermissions(partInbox("dead", n.id.Name)))
	if err != nil {
		return err
	}
	n.dir.static[deadPub] = deadID
	admitKey, admitPub, admitID, err := newPartIdentity("node-admitter:"+n.id.Name, admit.Permissions())
	if err != nil {
		return err
	}
	n.dir.static[admitPub] = admitID
	keys.responder, keys.deadLetters, keys.admitter = respKey, deadKey, admitKey
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
	if cut := site.Relink(n.bus, n.reg, old, new); cut > 0 {
		n.log.Info("the mesh's modules changed; the sites' links reconnect for their inboxes", "cut", cut)
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
		n.metrics.meter.FormSeconds.Set(time.Since(forming).Seconds())
		if err := n.startBus(octx, cluster, n.cfg.ClientAddr); err != nil {
			return err
		}
	default:
		if err := n.startBus(octx, nil, n.cfg.ClientAddr); err != nil {
			return err
		}
	}
	if err := n.connectResponders(respKey); err != nil {
		return err
	}
	n.budget = controller.NewBudget(n.bus.MaxStore(), n.cfg)
	n.newGate()
	return nil
}

// startBus starts the embedded server on the node's store, clustered when cluster is set,
// with clients on clientAddr.
func (n *Node) startBus(octx context.Context, cluster *embedbus.Cluster, clientAddr string) (err error) {
	readyTimeout := embedbus.DefaultReadyTimeout
	if cluster != nil {
		readyTimeout = formationReadyTimeout
		cluster.TLS = n.tls.keeper.RouteTLS()
	}
	syncAlways, syncEvery, err := n.cfg.SyncPolicy()
	if err != nil {
		return fmt.Errorf("sync %q: %w", n.cfg.Sync, err)
	}
	var clientTLS *tls.Config
	if n.clientTLSOn() {
		clientTLS = n.tls.keeper.ClientTLS()
	}
	n.bus, err = embedbus.Open(octx, embedbus.Config{
		Name:         n.cfg.Name,
		StoreDir:     filepath.Join(n.cfg.DataDir, datadir.JetStreamDir),
		ClientAddr:   clientAddr,
		Logger:       n.log.With("component", "nats"),
		Key:          n.key,
		InboxPrefix:  nodeInbox(n.id.Name),
		Directory:    n.dir,
		Cluster:      cluster,
		ClientTLS:    clientTLS,
		ReadyTimeout: readyTimeout,
		Complete:     n.dir.complete,
		Domain:       manifest.HubDomain, // every server's: sites reach the mesh's JetStream by it
		Leaf:         n.hub().Listen(clientAddr),
		MaxStore:     int64(n.cfg.StoreMaxBytes),
		SyncAlways:   syncAlways,
		SyncInterval: syncEvery,

		OnStartMemory:    n.OnStartMemory,
		StartMemoryLimit: n.StartMemoryLimit,
		OnDenied:         n.deniedConn,
		ModuleOf:         n.moduleOf,
	})
	if errors.Is(err, embedbus.ErrAddrInUse) {
		return fmt.Errorf("%w; another process has it: stop it or set --client-addr", err)
	}
	if err != nil {
		return fmt.Errorf("open bus: %w", err)
	}
	if cluster != nil && !cluster.NoAdvertise && n.mesh.members != nil { // its clients' bus: a port left to the system is bound
		n.mesh.members.BoundClient(n.bus.ClientURL())
	}
	// Pushed at each start (growing into a mesh starts the bus more than once); closeBus
	// closes the bus open at the time, once.
	n.closers.Push("bus", n.closeBus)
	return nil
}

// closeBus closes the bus, if one is open.
func (n *Node) closeBus() error {
	if n.bus == nil {
		return nil
	}
	err := n.bus.Close()
	n.bus = nil
	return err
}

// openMeshState makes the controller and brings the mesh's JetStream state to this node:
// the registry's and the leases' buckets and the mesh's streams (at once: in a new cluster
// each waits for its own raft group to elect a leader), the dead-letter writer, this node's
// identity in the registry, and every module's streams. The leases' store is returned for
// openServices.
func (n *Node) openMeshState(ctx context.Context, keys partKeys) (_ *seats.Store, err error) {
	if n.sign, err = envelope.NewSigningKey(n.key); err != nil {
		return nil, err
	}
	// The registry closes after the controller, which reads it (a registry never opened
	// closes as nothing).
	n.closers.Push("registry", n.reg.Close)
	n.ctrl = n.newController()
	n.closers.Push("controller", n.ctrl.Close)
	var leases *seats.Store
	defer func() {
		if err != nil && leases != nil {
			leases.Close() // not yet handed to the seat service, which Close closes
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer n.startStep("registry")
		return jsretry.Request(gctx, func(ctx context.Context) error {
			return n.reg.Open(ctx, n.bus.JetStream(), n.replicas(), n.budget.Registry)
		})
	})
	g.Go(func() error {
		defer n.startStep("leases")
		return jsretry.Request(gctx, func(ctx context.Context) (err error) {
			leases, err = seats.OpenStore(ctx, n.bus.JetStream(), n.replicas(), seats.DefaultTTL, n.budget.Leases)
			if err == nil {
				leases.SetLogger(n.log.With("component", "seats"))
				leases.OnHolderChange(n.metrics.meter.HolderChanged)
			}
			return err
		})
	})
	g.Go(func() error {
		defer n.startStep("mesh streams")
		return jsretry.Request(gctx, n.ctrl.Topology().EnsureMesh)
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	dead, err := n.openDeadLetters(keys.deadLetters)
	if err != nil {
		return nil, err
	}
	n.closers.Push("dead letters", dead.Close)
	if err := n.publishIdentity(ctx, keys.vaultPub); err != nil {
		return nil, err
	}
	n.startStep("identity")
	if err := n.ctrl.ReconcileAll(ctx); err != nil { // retried step by step
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
	if err := jsretry.Request(ctx, func(ctx context.Context) error {
		return n.reg.SetNode(ctx, n.id.Name, registry.NodeIdentity{PublicKey: n.id.PublicKey, XKey: xpub})
	}); err != nil {
		return err
	}
	if vaultPub == "" {
		return nil
	}
	return jsretry.Request(ctx, func(ctx context.Context) error { return n.reg.SetVault(ctx, vaultPub) })
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
	if err := jsretry.Request(ctx, func(ctx context.Context) error { return n.checkKept(ctx, known, mayMark) }); err != nil {
		return fmt.Errorf("check the mesh's buckets: %w", err)
	}
	if !known {
		if err := markBucketsKnown(n.db); err != nil {
			return err
		}
	}
	n.checkBadRecords()
	if err := n.subscribe(api.NodeToolAcceptLoss+" tool", n.serveAcceptLoss); err != nil {
		return fmt.Errorf("serve %s: %w", api.NodeToolAcceptLoss, err)
	}
	return nil
}

// subscribe makes one of the node's subscriptions with serve and unsubscribes it at Close.
func (n *Node) subscribe(name string, serve func() (*nats.Subscription, error)) error {
	sub, err := serve()
	if err != nil {
		return err
	}
	n.closers.PushFunc(name, func() { sub.Unsubscribe() })
	return nil
}

// newHTTPServer makes the metrics and the HTTP API, which the server (serving since Open
// bound its listener) answers with from now on.
func (n *Node) newHTTPServer() error {
	n.metrics.reg = metrics.NewRegistry(metrics.Config{
		Started: n.started,
		Version: formats.MeshnodeVersion(),
		Bus:     func() *embedbus.Bus { return n.bus },
		Audit: func() (records, lag uint64) {
			st := n.auditStatus(context.Background())
			return st.Records, st.Lag
		},
		AuditMissed: func() uint64 { // not auditStatus: its JetStream requests are not needed for a counter
			if n.audit == nil {
				return 0
			}
			return n.audit.Missed()
		},
		AuditNotGenuine: func() map[string]uint64 {
			if n.audit == nil {
				return nil
			}
			return n.audit.NotGenuine()
		},
		AuditNotGenuineKinds: audit.NotGenuineKinds,
		StoreBytes: func() int64 {
			if st, err := os.Stat(filepath.Join(n.cfg.DataDir, datadir.StoreFile)); err == nil {
				return st.Size()
			}
			return 0
		},
	})
	n.metrics.reg.MustRegister(n.ctrl.Reports())
	n.metrics.reg.MustRegister(n.paceCollectors()...)
	n.metrics.reg.MustRegister(n.metrics.meter.Collectors()...)
	n.metrics.reg.MustRegister(&metrics.StreamCollector{Bus: func() *embedbus.Bus { return n.bus }})
	n.metrics.reg.MustRegister(&metrics.Admission{Limit: max(n.budget.Module, 0), Lag: n.admit.Lag,
		Use: func() []api.QuotaUse { return n.admit.Use(n.reg.Names()) }})
	tools := metrics.NewModuleTools(n.id.Name, func(module, tool string) bool {
		e, ok := n.reg.Get(module)
		return ok && metrics.DeclaresTool(e.Manifest, tool)
	})
	n.metrics.reg.MustRegister(tools)
	if err := n.subscribe("modules' tool latency", func() (*nats.Subscription, error) {
		return n.bus.Conn().Subscribe(manifest.StatsSubject("*", n.id.Name), tools.Take)
	}); err != nil {
		return fmt.Errorf("take the modules' tool latency: %w", err)
	}
	n.web.dash = n.openDashboard()
	n.closers.Push("dashboard", n.web.dash.Close)
	if err := n.subscribe("ui tool", n.serveUIChallenge); err != nil {
		return fmt.Errorf("serve the ui tool: %w", err)
	}
	h := n.handler()
	n.web.handler.Store(&h)
	return nil
}

// announce serves the cluster's tools and tells the mesh this node joined, on a node with
// peers.
func (n *Node) announce() (err error) {
	if err := n.subscribe("cert-rotate tool", n.serveCertRotate); err != nil {
		return fmt.Errorf("serve the cert-rotate tool: %w", err)
	}
	if n.mesh.members == nil {
		// A single node: it may grow into a mesh.
		if err := n.subscribe("grow tool", n.serveGrow); err != nil {
			return fmt.Errorf("serve the grow tool: %w", err)
		}
		if n.found.GrowPhase == growWaiting {
			return n.gossipToGrow()
		}
		return nil
	}
	n.mesh.work = lifecycle.NewGroup(context.Background())
	n.closers.PushFunc("cluster tools' work", n.mesh.work.Close)
	for _, tool := range []string{api.NodeToolLeave, api.NodeToolRemove} {
		if err := n.subscribe(tool+" tool", func() (*nats.Subscription, error) { return n.serveCluster(tool) }); err != nil {
			return fmt.Errorf("serve cluster tools: %w", err)
		}
	}
	if err := n.subscribe("servers gone", n.dropRoutesOfGone); err != nil {
		return fmt.Errorf("watch for servers gone: %w", err)
	}
	publishNodeEvent(n.bus.Conn(), n.key, n.id.Name, "joined", map[string]any{
		"node": n.id.Name, "mesh_id": n.id.MeshID, "client_url": n.bus.ClientURL(), "cluster_addr": n.cfg.ClusterAddr,
	}, n.log)
	n.mesh.eventConn.Store(n.bus.Conn())
	n.closers.PushFunc("node events", func() {
		n.mesh.eventConn.Store(nil)
		if !n.mesh.left.Load() { // a node that left said so
			publishNodeEvent(n.bus.Conn(), n.key, n.id.Name, "stopped", map[string]any{"node": n.id.Name}, n.log)
			n.bus.Conn().FlushTimeout(time.Second)
		}
	})
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
			case <-n.quit.ch: // the node left its mesh
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
	add("declaration follower", n.mods.host.Run)
	add("reports", n.runReports)
	add("drift check", n.watchDrift)
	// The keeper places copies only on servers JetStream knows: a server registered before
	// its JetStream peer has joined the meta group counts once it has.
	keeper := replication.Keeper{JS: n.bus.JetStream(), Servers: n.replicationServers, Holds: n.holdsController,
		Recheck: time.Duration(n.cfg.DriftInterval), Log: n.log.With("component", "replication")}
	add("replication", keeper.Run)
	sched := &snapshot.Schedule{Interval: time.Duration(n.cfg.SnapshotInterval), Dir: n.cfg.ScheduledSnapshotDir(), Keep: n.cfg.SnapshotKeep,
		Conn: n.bus.Conn(), MeshID: n.id.MeshID, Operator: n.id.OperatorKey, Version: formats.MeshnodeVersion(), Node: n.id.Name,
		Seal: func() (*api.SealedFoundation, error) { return n.dir.vault.Load().SealedFoundation() }, AuditQuery: n.audit.Query,
		Holds: n.holdsController, Alarms: &n.alarms, LastSuccess: n.metrics.meter.SnapshotLast, Failures: n.metrics.meter.SnapshotFailures,
		Log: n.log.With("component", "snapshot")}
	add("scheduled snapshots", sched.Run)
	if w := n.mesh.formats; w != nil {
		add("formats", w.Run)
	}
	add("admitter", n.runAdmitter)
	add("flood watch", n.watchFloods)
	add("certificate renewal", n.renewCerts)
	g.Add(func() error {
		// Served since Open bound it (serveEarly): this waits for it to end.
		<-n.web.done
		if err := n.web.err; !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	}, func(error) {
		n.web.dash.Close() // its event streams never go idle: Shutdown would wait them out
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(n.cfg.ShutdownTimeout)/2)
		defer cancel()
		n.web.srv.Shutdown(ctx)
	})

	n.log.Info("node running", "client_url", n.bus.ClientURL(), "http", n.HTTPURL(), "mesh_id", n.id.MeshID)
	err := g.Run()
	if errors.Is(err, run.ErrSignal) {
		n.log.Info("stopping", "reason", err.Error())
		return nil
	}
	if err == nil && n.grower.restart.Load() {
		return ErrRestart
	}
	return err
}

// Close undoes the steps Open took, the last first (each pushed its close on closers as
// it opened), and removes node.json. It returns the parts' errors joined, each naming its
// part, and is safe on a partly opened node and more than once.
func (n *Node) Close() error { return n.closers.Close() }

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

// openSeats takes the lease store, starts the node's seat tool, and takes the mesh's own
// seats this node is a candidate for before the node reports ready.
func (n *Node) openSeats(ctx context.Context, store *seats.Store) error {
	s := &seatService{
		log: n.log.With("component", "seats"), node: n.id.Name, key: n.key,
		bus: n.bus, resp: n.resp.nc, gate: n.resp.gate, reg: n.reg, topo: n.ctrl.Topology(), store: store, ctrl: n.ctrl, vault: n.vault,
	}
	s.run = seats.NewRunner(store, n.id.Name, s.log, s.alive, s.hooks())
	s.onControl = n.reportUnreachable
	n.seats = s
	n.closers.Push("seats", func() error {
		s.stop() // releases this node's leases: a graceful stop hands its seats on at once
		return s.store.Close()
	})
	n.dir.seats.Store(s)
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
	n.closers.PushFunc("vault's connection", n.vaultNC.Close)
	err = jsretry.Request(ctx, func(ctx context.Context) (err error) {
		n.vault, err = vault.Open(ctx, vault.Config{
			Log:         n.log.With("component", "vault"),
			MeshID:      n.id.MeshID,
			Node:        n.id.Name,
			Conn:        n.vaultNC,
			Responder:   n.resp.vault,
			Key:         key,
			BarrierKey:  n.found.BarrierKey,
			Replicas:    n.replicas(),
			MaxBytes:    n.budget.Vault,
			RateLimit:   n.cfg.RateLimit,
			Served:      n.metrics.meter.Served,
			RateLimited: n.metrics.meter.RateLimited,
			Flooding:    n.floodingCaller,
			Secrets: func(module string) ([]string, bool) {
				e, ok := n.reg.Get(module)
				if !ok {
					return nil, false
				}
				return e.Manifest.Secrets, true
			},
			Enrolment: n.enrolment, EnrolSite: n.hub().Enrol,
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
	n.closers.Push("vault", n.vault.Close)
	n.dir.vault.Store(n.vault)
	return nil
}

// openHost reads the declaration this node applied last and makes the follower of its next
// ones: signed by a server of the mesh, checked against the registry's node keys.
func (n *Node) openHost() (err error) {
	n.mods.host, err = host.Open(host.Config{
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
	src := provenance.Sources{Node: n.id.Name, NodeKey: n.id.PublicKey, Registry: n.reg,
		Leases: func() provenance.Leases {
			if s := n.dir.seats.Load(); s != nil {
				return s.store
			}
			return nil
		}}
	n.audit, err = audit.New(n.db, n.bus.JetStream(), n.id.Name, src.Key, src.Owns, time.Duration(n.cfg.AuditRetention), n.log.With("component", "audit"))
	if err != nil {
		return err
	}
	n.audit.SetEventsMaxAge(time.Duration(n.cfg.EventsMaxAge))
	n.audit.Ingested, n.audit.Unsettled = n.metrics.meter.Ingested, src.Unsettled
	return n.subscribe("audit tool", func() (*nats.Subscription, error) { return audit.Serve(n.resp.nc, n.id.Name, n.audit) })
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
	if err := datadir.WriteFileAtomic(filepath.Join(n.cfg.DataDir, datadir.OperatorSeedFile), []byte(id.Seed+"\n"), 0o600); err != nil {
		return fmt.Errorf("write operator seed: %w", err)
	}
	if err := datadir.KeepOperator(n.db, id.PublicKey); err != nil {
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
func (n *Node) requestStop() { n.quit.once.Do(func() { close(n.quit.ch) }) }

// Identity returns the node's identity.
func (n *Node) Identity() datadir.Identity { return n.id }

// ClientURL is the NATS URL of the node's bus.
func (n *Node) ClientURL() string { return n.bus.ClientURL() }

// HTTPURL is the base URL of the node's HTTP API.
func (n *Node) HTTPURL() string {
	if n.web.ln == nil {
		return ""
	}
	return meshca.HTTPURL(n.cfg.HTTPAddr, n.web.ln.Addr(), meshca.HTTPS(n.cfg.HTTPAddr))
}

// HasVault reports whether this node holds the vault's credentials (and can serve it).
func (n *Node) HasVault() bool {
	pub, _ := n.dir.vaultKey.Load().(string)
	return pub != ""
}

// Bus is the node's embedded bus.
func (n *Node) Bus() *embedbus.Bus { return n.bus }

// info is this node's node.json without the addresses its bus and HTTP API bind.
func (n *Node) info() datadir.Info {
	return datadir.Info{Name: n.id.Name, MeshID: n.id.MeshID, PID: os.Getpid(), Version: formats.MeshnodeVersion(),
		ClusterAddr: n.cfg.ClusterAddr, GossipAddr: n.cfg.GossipAddr, Started: n.started.UTC()}
}
