// Package site runs what a site of a mesh needs of its own (issue 42): a node that links to
// the hub over a leafnode connection it opens itself and runs its own JetStream in a domain
// of its own, so its modules go on emitting while the link is down.
//
// A Site is its bus (embedbus, with Config.Hub), a mirror of the hub's registry in its domain
// (registry.OpenMirror), which decides who connects and with what permissions — the same
// derived ones the hub grants — while the link is down as while it is up, and answers a
// module's whoami (so the Go sdk connects to a site as to a node), SITE_EVENTS, where its
// modules' events are stored before the hub's EVENTS sources them (through a durable
// consumer, SourceConsumer), an admitter that passes each module's emits to it, and, with
// Config.DB, an audit log of SITE_EVENTS of its own. Join
// enrols a data dir as a site with a join token and Load opens it: what `meshnode join
// --leaf` and `meshnode run` do. Hub is a mesh server's side: where it takes links, how it
// records a site, and what it grants a link (LinkIdentity).
//
// Not built yet (docs/scale.md): its admitter's quotas and back-pressure, its rate limit on
// whoami; a module's consumers across the link; TLS on a site's client port.
package site

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/meshnode/meshnode/admit"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/controller"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/provenance"
	"github.com/meshnode/meshnode/registry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// Config is what a Site needs.
type Config struct {
	// Name is the site's node name: its server's name, and its domain's (SiteDomain).
	Name string
	// StoreDir is its JetStream's store.
	StoreDir string
	// ClientAddr is host:port for its modules.
	ClientAddr string
	// Key is the site node's nkey: its own connections and its link to the hub.
	Key nkeys.KeyPair
	// HubURLs are the hub servers' leafnode URLs; HubTLS the link's TLS (nil: plain).
	HubURLs []string
	HubTLS  *tls.Config
	// EventsMaxBytes bounds SITE_EVENTS (zero: no bound but the store's): what the site
	// keeps while its link is down.
	EventsMaxBytes int64
	// MirrorWait bounds how long Open waits for the registry's mirror to catch up with the
	// hub before the site admits modules by what it holds; zero means DefaultMirrorWait. A
	// site that starts cut off waits this long, then goes on with its last copy.
	MirrorWait time.Duration
	// DB, if set, holds the site's audit log (its data dir's store): every event its modules
	// emit, checked and recorded as the servers' audit logs record EVENTS, and answered on
	// the audit tool (api.AuditToolSubject of Name). Nil: the site keeps no audit log.
	DB  *bolt.DB
	Log *slog.Logger
}

// DefaultMirrorWait is Config.MirrorWait's default.
const DefaultMirrorWait = 10 * time.Second

// Site is a running site.
type Site struct {
	bus    *embedbus.Bus
	reg    *registry.Registry
	admit  *admit.Admitter
	whoami *nats.Subscription
	cancel context.CancelFunc
	done   chan error         // the registry mirror's Run
	tool   *nats.Subscription // the audit tool
	logged chan error         // the audit log's Run
}

// Open starts the site's bus linked to its hub, its registry mirror, SITE_EVENTS and its
// admitter. Connects of keys the site does not know yet wait until the mirror is read.
func Open(ctx context.Context, cfg Config) (_ *Site, err error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	seed, err := cfg.Key.Seed()
	if err != nil {
		return nil, fmt.Errorf("site key: %w", err)
	}
	admitKey, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	s := &Site{}
	// A module whose registration changed connects again, under its new authority.
	reg := registry.New(cfg.Log.With("component", "registry"), func(old, _ *registry.Entry) {
		if b := s.bus; b != nil && old != nil {
			b.Kick(old.PublicKey)
		}
	})
	dir := &directory{reg: reg, static: map[string]embedbus.Identity{}}
	dir.add(cfg.Key, embedbus.Identity{Name: "node:" + cfg.Name}) // the site's own work: everything
	ap := admit.Permissions()
	dir.add(admitKey, embedbus.Identity{Name: "admit", Permissions: &ap})
	complete := make(chan struct{})
	bus, err := embedbus.Open(ctx, embedbus.Config{
		Name: cfg.Name, StoreDir: cfg.StoreDir, ClientAddr: cfg.ClientAddr, Logger: cfg.Log.With("component", "nats"),
		Directory: dir, Key: cfg.Key, InboxPrefix: "_INBOX.site-" + cfg.Name, Complete: complete,
		Domain: manifest.SiteDomain(cfg.Name),
		Hub:    &embedbus.Hub{URLs: cfg.HubURLs, Seed: seed, TLS: cfg.HubTLS, Deny: manifest.SiteDenied()},
	})
	if err != nil {
		return nil, fmt.Errorf("open the site's bus: %w", err)
	}
	s.bus, s.reg = bus, reg
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	js := bus.JetStream()
	// The hub's EVENTS asks for the consumer as soon as the link is up: it exists by then on
	// every open but the first, and on the first it is made before anything waits on the hub.
	if _, err := ensure.Stream(ctx, js, EventsStream(cfg.EventsMaxBytes)); err != nil {
		return nil, fmt.Errorf("open %s: %w", manifest.SiteEventsStreamName, err)
	}
	if _, err := js.CreateOrUpdatePushConsumer(ctx, manifest.SiteEventsStreamName, SourceConsumer(cfg.Name)); err != nil {
		return nil, fmt.Errorf("open %s's consumer for the hub: %w", manifest.SiteEventsStreamName, err)
	}
	if err := reg.OpenMirror(ctx, js, 0); err != nil {
		return nil, err
	}
	run, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	go func() { s.done <- reg.Run(run) }()
	if err := s.catchUp(ctx, cfg.MirrorWait, cfg.Log); err != nil {
		return nil, err
	}
	close(complete)
	if cfg.DB != nil {
		if err := s.openAudit(ctx, cfg, run); err != nil {
			return nil, err
		}
	}
	// A module asks the site which module it is, as it would ask the hub's controller: its
	// connection learns its declarations from the site's copy of the registry.
	if s.whoami, err = bus.Conn().Subscribe(manifest.WhoamiSubjects, func(m *nats.Msg) {
		key := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		reply, answer, why := reg.Whoami(key, m.Reply, m.Data, cfg.Name)
		if !answer {
			if why != "" {
				cfg.Log.Debug("whoami: not answered", "key", key, "reply", m.Reply, "why", why)
			}
			return
		}
		b, _ := json.Marshal(reply)
		m.Respond(b)
	}); err != nil {
		return nil, fmt.Errorf("answer whoami: %w", err)
	}
	cutOff := func() string {
		if bus.Linked() {
			return ""
		}
		return fmt.Sprintf("site %s is cut off from the mesh, whose servers queue a seat's jobs: submit it again once the site's link is back", cfg.Name)
	}
	if s.admit, err = admit.New(admit.Config{Dial: bus.Dial, Key: admitKey, Log: cfg.Log.With("component", "admit"), JobsRefused: cutOff}); err != nil {
		return nil, fmt.Errorf("start the site's admitter: %w", err)
	}
	return s, nil
}

// openAudit opens the site's audit log on SITE_EVENTS, through its own consumer there, and
// answers its audit tool.
func (s *Site) openAudit(ctx context.Context, cfg Config, run context.Context) error {
	if _, err := s.bus.JetStream().CreateOrUpdateConsumer(ctx, manifest.SiteEventsStreamName, controller.AuditConsumerConfig(cfg.Name)); err != nil {
		return fmt.Errorf("open the audit log's consumer on %s: %w", manifest.SiteEventsStreamName, err)
	}
	pub, _ := cfg.Key.PublicKey()
	src := provenance.Sources{Node: cfg.Name, NodeKey: pub, Registry: s.reg} // a site holds no seat
	l, err := audit.New(cfg.DB, s.bus.JetStream(), cfg.Name, src.Key, src.Owns, 0, cfg.Log.With("component", "audit"))
	if err != nil {
		return err
	}
	l.SetStream(manifest.SiteEventsStreamName)
	l.SetEventsMaxAge(manifest.DefaultEventsMaxAge)
	s.logged = make(chan error, 1)
	go func() { s.logged <- l.Run(run) }()
	if s.tool, err = audit.Serve(s.bus.Conn(), cfg.Name, l); err != nil {
		return fmt.Errorf("answer the audit tool: %w", err)
	}
	return nil
}

// catchUp waits, up to bound, until the registry's mirror has caught up with the hub's bucket
// and this Registry holds all of it; past bound it logs and returns: the site goes on with
// the copy it has. Only ctx ending is an error.
func (s *Site) catchUp(ctx context.Context, bound time.Duration, log *slog.Logger) error {
	if bound <= 0 {
		bound = DefaultMirrorWait
	}
	deadline := time.Now().Add(bound)
	stream, err := s.bus.JetStream().Stream(ctx, "KV_"+registry.Bucket)
	if err != nil {
		return fmt.Errorf("the registry's mirror: %w", err)
	}
	for {
		info, err := stream.Info(ctx)
		if err == nil && info.Mirror != nil && info.Mirror.Active >= 0 && info.Mirror.Lag == 0 &&
			s.reg.Revision() >= info.State.LastSeq {
			return nil
		}
		if time.Now().After(deadline) {
			log.Warn("the registry's mirror has not caught up with the hub; admitting modules by the copy the site has", "waited", bound)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// EventsStream is SITE_EVENTS' configuration: every event the site's modules emit, kept as
// long as the hub's EVENTS keeps one, deduplicated like it, and refusing new events when full
// rather than evicting what the hub may not have sourced yet.
func EventsStream(maxBytes int64) jetstream.StreamConfig {
	if maxBytes <= 0 {
		maxBytes = -1 // JetStream's "no bound"
	}
	return jetstream.StreamConfig{
		Name:        manifest.SiteEventsStreamName,
		Description: "meshnode: this site's events, sourced by the hub's EVENTS",
		Subjects:    manifest.EventPatterns(),
		Storage:     jetstream.FileStorage,
		MaxAge:      manifest.DefaultEventsMaxAge,
		Duplicates:  manifest.DefaultDuplicateWindow,
		MaxBytes:    maxBytes,
		Discard:     jetstream.DiscardNew,
	}
}

// SourceConsumer is the durable consumer on SITE_EVENTS the hub's EVENTS sources through:
// pushed to the hub across the link, flow-controlled, acknowledged by the flow control's
// answers (JetStream's durable sourcing); controller.SiteSource names it on the hub.
func SourceConsumer(site string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        manifest.SiteSourceConsumer,
		Description:    "meshnode: the hub's EVENTS sources this site's events through it",
		DeliverSubject: manifest.SiteDeliverSubject(site),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckFlowControlPolicy,
		FlowControl:    true,
		IdleHeartbeat:  time.Second, // what JetStream requires of it
		MaxAckPending:  sourceMaxAckPending,
	}
}

// sourceMaxAckPending bounds the events in flight to the hub, unacknowledged.
const sourceMaxAckPending = 10_000

// Bus is the site's bus.
func (s *Site) Bus() *embedbus.Bus { return s.bus }

// Close stops the admitter, the registry's mirror and the bus.
func (s *Site) Close() error {
	var errs []error
	if s.whoami != nil {
		errs = append(errs, s.whoami.Unsubscribe())
	}
	if s.admit != nil {
		errs = append(errs, s.admit.Close())
	}
	if s.tool != nil {
		errs = append(errs, s.tool.Unsubscribe())
	}
	if s.cancel != nil {
		s.cancel()
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			errs = append(errs, errors.New("the registry's mirror did not stop"))
		}
		if s.logged != nil {
			select {
			case <-s.logged:
			case <-time.After(5 * time.Second):
				errs = append(errs, errors.New("the audit log did not stop"))
			}
		}
		errs = append(errs, s.reg.Close())
	}
	errs = append(errs, s.bus.Close())
	return errors.Join(errs...)
}

// directory is the site's: its own keys, the operator, and each registered module with the
// permissions its manifest derives — read from the site's mirror of the registry, so the
// site decides while its link is down as the hub would.
type directory struct {
	static map[string]embedbus.Identity
	reg    *registry.Registry
}

func (d *directory) add(kp nkeys.KeyPair, id embedbus.Identity) {
	pub, _ := kp.PublicKey()
	d.static[pub] = id
}

func (d *directory) Identity(publicKey, _ string) (embedbus.Identity, bool) {
	if id, ok := d.static[publicKey]; ok {
		return id, true
	}
	if op := d.reg.Operator(); op != "" && op == publicKey {
		return embedbus.Identity{Name: "operator", System: true}, true
	}
	e, ok := d.reg.ByKey(publicKey)
	if !ok || !e.Derivation.Bus {
		return embedbus.Identity{}, false
	}
	p := e.Derivation.Grant(publicKey)
	return embedbus.Identity{Name: "module:" + e.Module, Permissions: &p}, true
}
