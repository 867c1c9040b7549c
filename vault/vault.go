package vault

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/mirror"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/recovery"
	"github.com/meshnode/meshnode/throttle"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// Bucket is the KV bucket of the vault's records: barrier-encrypted secrets, and metadata of
// identities and join tokens. Nothing in it is readable without the barrier key.
const Bucket = "mesh-vault"

// Defaults of the vault.
const (
	DefaultGrace    = 24 * time.Hour // how long a rotated-out version stays readable
	DefaultTokenTTL = time.Hour
	requestTimeout  = 10 * time.Second
)

// Config is what the node hands the vault.
type Config struct {
	Log    *slog.Logger
	MeshID string
	Node   string
	// Conn is the vault's own connection, authenticated with Key: its bus identity.
	Conn *nats.Conn
	Key  nkeys.KeyPair
	// Responder answers the vault's tools: a connection that may publish only to inboxes,
	// so a request's reply subject cannot make the vault write anywhere else. Required.
	Responder *nats.Conn
	// BarrierKey encrypts every record (AES-256-GCM); it never enters a stream.
	BarrierKey []byte
	Replicas   int
	// MaxBytes bounds the vault's bucket (reserved with JetStream); zero: no bound.
	MaxBytes int64
	// RateLimit is how many requests a second one module or join token may make, with bursts
	// of twice as many; zero: no limit.
	RateLimit int
	// Served, when set, is told each request the vault answered: its verb, how long the
	// answer took from the request's arrival, and whether it
	// was refused (the node's metrics).
	Served func(verb string, refused bool, took time.Duration)
	// RateLimited, when set, is told each request dropped past its caller's rate limit.
	RateLimited func(verb string)
	// Flooding, when set, is told of a caller that keeps on past its refusals (the rate
	// limit's throttle.Gate.OnFlood): quickly, on the request's goroutine.
	Flooding func(caller string, refused int)
	// Secrets returns the secret names a registered module declares.
	Secrets func(module string) ([]string, bool)
	// Enrolment is what an enrolled node receives.
	Enrolment func() api.Enrolment
	// Admit refuses a joining node the mesh cannot take (its name is a server's already);
	// nil admits every node.
	Admit func(node string) error
	// EnrolSite records a site joining with a token (named site, its link authenticating
	// with key) and returns its enrolment, or refuses it; nil: the mesh takes no sites.
	EnrolSite func(ctx context.Context, site, key string) (api.Enrolment, error)
	// Addrs are the client URLs a join token tells the joining node to contact.
	Addrs func() []string
	// ServerXKey returns a server's recorded xkey: the vault's own credentials are sealed
	// only to that.
	ServerXKey func(node string) (string, bool)
	// Declared returns what node's current declaration (STATE, signed by the controller)
	// says of module: a node receives only the credentials of modules it must run.
	Declared func(ctx context.Context, node, module string) (DeclaredModule, bool)
}

// DeclaredModule is what a node's declaration says of a module, as far as the vault needs to
// know: the vault is below deploy, which owns declarations, so the node translates.
type DeclaredModule struct {
	// PublicKey is the module's identity: the kept seed must be its.
	PublicKey string
	// Secrets are the secret names sent with the seed.
	Secrets []string
	// Provisions are the interfaces whose credentials a provider seat keeps in the vault and
	// are sent with the seed; the interfaces the mesh provides itself (kv) need none and are
	// not listed.
	Provisions []string
}

// Vault is the mesh-vault seat's work on this node.
type Vault struct {
	cfg  Config
	log  *slog.Logger
	js   jetstream.JetStream
	kv   jetstream.KeyValue
	aead cipher.AEAD
	// intake is the xkey providers seal credentials to (derived from the barrier key).
	intake nkeys.KeyPair
	sign   *envelope.SigningKey
	watch  *mirror.Watch

	mu      sync.RWMutex
	tokens  map[string]tokenRecord // by public key: who may enrol
	records map[string]recordEntry // by key: the secrets, still encrypted
	sub     *nats.Subscription
	shut    bool // Close has begun: Start serves no more

	// gate bounds each module's and join token's requests, and turns refusals into one
	// "refused" event per caller and verb per interval, with a count.
	gate     *throttle.Gate
	gateStop func() // ends the gate's reports, the last one made

	// writeMu serialises the writes of secret records: an action's and its outbox's.
	writeMu sync.Mutex
	// sweepStop ends the outbox sweeper while this node serves the vault; sweepNow wakes it.
	sweepStop context.CancelFunc
	sweepers  sync.WaitGroup // the sweepers still ending
	sweepNow  chan struct{}

	events chan event // recorded by a worker, off the requests' path
	// recordCtx bounds the worker's publishes; Close ends it closeGrace after it closes
	// events, so a stopping node does not wait out an EVENTS without a quorum.
	recordCtx  context.Context
	recordStop context.CancelFunc
	done       chan struct{}
	// closing guards events: senders hold it shared, Close takes it to close the channel,
	// so a request still being answered at shutdown never sends on a closed channel.
	closing sync.RWMutex
	closed  bool
}

// recordEntry is a secret record as the mirror holds it: ciphertext and its revision.
type recordEntry struct {
	rec secretRecord
	rev uint64
}

// Open opens the bucket and loads the join tokens; Watch must then run, and Start serves
// the tools (while this node holds the mesh-vault seat).
func Open(ctx context.Context, cfg Config) (*Vault, error) {
	if len(cfg.BarrierKey) != 32 {
		return nil, errors.New("vault: the barrier key must be 32 bytes")
	}
	if cfg.Conn == nil || cfg.Responder == nil {
		return nil, errors.New("vault: its own connection and a responder connection are required")
	}
	block, err := aes.NewCipher(cfg.BarrierKey)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	sign, err := envelope.NewSigningKey(cfg.Key)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	kv, err := ensure.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "meshnode: vault records (barrier-encrypted secrets, identities, join tokens)",
		History:     2,
		Replicas:    cfg.Replicas,
		Storage:     jetstream.FileStorage,
		MaxBytes:    cfg.MaxBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", Bucket, err)
	}
	intake, err := intakeKey(cfg.BarrierKey)
	if err != nil {
		return nil, err
	}
	v := &Vault{cfg: cfg, log: cfg.Log, js: js, kv: jsretry.Wrap(kv), aead: aead, sign: sign, intake: intake,
		tokens: map[string]tokenRecord{}, records: map[string]recordEntry{},
		events: make(chan event, eventQueue), done: make(chan struct{}), sweepNow: make(chan struct{}, 1)}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	// The mirror keeps tokens (the bus's authentication reads them) and the encrypted
	// secret records (a fetch then needs no round trip to the bucket).
	if v.watch, err = mirror.Open(ctx, kv, v.apply, "token.>", "secret.>"); err != nil {
		return nil, fmt.Errorf("load %s: %w", Bucket, err)
	}
	v.recordCtx, v.recordStop = context.WithCancel(context.Background())
	go v.record()
	v.gate = throttle.New(float64(cfg.RateLimit), 2*cfg.RateLimit, 0, func(r throttle.Refusal) {
		v.queue(event{action: "refused", meta: map[string]any{"caller": r.Identity, "verb": r.Reason, "count": r.Count,
			"last_reason": r.Detail, "until": r.Until}})
	})
	if cfg.Flooding != nil {
		v.gate.OnFlood(cfg.Flooding)
	}
	v.gateStop = v.gate.Start()
	return v, nil
}

// Watch follows the vault's records until ctx ends.
func (v *Vault) Watch(ctx context.Context) error { return v.watch.Run(ctx) }

// Close stops serving and the watch, and records the events still queued; called again, it
// does nothing.
func (v *Vault) Close() error {
	v.mu.Lock()
	again := v.shut
	v.shut = true // a seat won while closing must not start a sweeper Close would not wait for
	v.mu.Unlock()
	if again {
		return nil
	}
	v.Stop()
	v.sweepers.Wait()
	v.gateStop() // its last report is queued before the queue closes
	v.closing.Lock()
	v.closed = true
	close(v.events)
	v.closing.Unlock()
	grace := time.AfterFunc(closeGrace, v.recordStop)
	defer grace.Stop()
	<-v.done
	v.recordStop()
	return v.watch.Close()
}

// queue hands events to the worker; after Close they are logged instead.
func (v *Vault) queue(events ...event) {
	v.closing.RLock()
	defer v.closing.RUnlock()
	for _, e := range events {
		if v.closed {
			v.log.Warn("vault stopping: event not recorded", "action", e.action)
			continue
		}
		v.events <- e
	}
}

// closeGrace is how long Close lets the events still queued be recorded; those left then
// are logged as not recorded (a secret's mint and rotation wait in its record's outbox).
const closeGrace = time.Second

// eventQueue bounds the audit events waiting to be recorded; a full queue makes requests
// wait rather than lose a record.
const eventQueue = 1024

// record publishes queued events, in order, until Close; "fetched" events of a version
// fetched again within FetchedEvery of its last are counted into one (fetchTally).
func (v *Vault) record() {
	defer close(v.done)
	recordEvents(v.events, FetchedEvery, v.publish, func(key string) {
		ctx, cancel := context.WithTimeout(v.recordCtx, requestTimeout)
		defer cancel()
		if err := v.flushOutbox(ctx, key); err != nil {
			v.log.Warn("vault events wait in their record; the sweep tries again", "key", key, "err", err)
			outbox.Wake(v.sweepNow)
		}
	})
}

// recordEvents is record's loop: each event published or its outbox flushed in turn, the
// fetches held by a fetchTally of every published when due, and all of them once events
// closes.
func recordEvents(events <-chan event, every time.Duration, publish func(event), flush func(key string)) {
	tally := newFetchTally(every)
	var due *time.Timer
	var dueC <-chan time.Time
	var dueAt time.Time
	// arm sets the timer for the earliest held fetches, sooner if they are due sooner than
	// it was set for (another version's).
	arm := func() {
		at, ok := tally.next()
		if !ok || dueC != nil && !at.Before(dueAt) {
			return
		}
		if due != nil {
			due.Stop() // Go 1.23's timers: no stale tick left in the channel
		}
		due, dueAt = time.NewTimer(time.Until(at)), at
		dueC = due.C
	}
	defer func() {
		if due != nil {
			due.Stop()
		}
	}()
	for {
		select {
		case <-dueC:
			dueC = nil
			for _, e := range tally.due(time.Now(), false) {
				publish(e)
			}
			arm()
		case e, ok := <-events:
			if !ok {
				for _, e := range tally.due(time.Now(), true) {
					publish(e)
				}
				return
			}
			switch {
			case e.flush != "":
				flush(e.flush)
			case e.action == "fetched" && tally.add(e, time.Now()):
				arm()
			default:
				publish(e)
			}
		}
	}
}

// Start serves the vault's tools (queue group mesh-vault).
func (v *Vault) Start() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.shut {
		return ErrClosed
	}
	if v.sub != nil {
		return nil
	}
	sub, err := v.cfg.Responder.QueueSubscribe(api.VaultToolSubject("*", ">"), manifest.VaultSeat, v.serve)
	if err != nil {
		return fmt.Errorf("serve vault: %w", err)
	}
	v.sub = sub
	var sweep context.Context
	sweep, v.sweepStop = context.WithCancel(context.Background())
	v.sweepers.Add(1)
	go func() {
		defer v.sweepers.Done()
		v.sweepOutboxes(sweep)
	}()
	return v.cfg.Responder.Flush()
}

// ErrClosed is Start's refusal once Close has begun.
var ErrClosed = errors.New("vault: closed")

// Stop stops serving the tools: this node no longer holds the seat.
func (v *Vault) Stop() {
	v.mu.Lock()
	if v.sub == nil {
		v.mu.Unlock()
		return
	}
	v.sub.Unsubscribe()
	v.sub = nil
	v.sweepStop() // not waited for: Stop runs in the seat's hooks, which must be quick (Close waits)
	v.mu.Unlock()
}

// serve answers one request: mesh.seat.mesh-vault.tool.<verb>.<caller>.
func (v *Vault) serve(m *nats.Msg) {
	arrived := time.Now()
	parts := strings.SplitN(m.Subject, ".", 6)
	if len(parts) < 6 {
		return
	}
	verb, caller := parts[4], parts[5]
	if !v.mayReply(caller, m.Reply) {
		// Not answered, and not recorded per request: a flood of these must cost nothing.
		v.log.Debug("a reply outside the caller's inbox is not answered", "caller", caller, "reply", m.Reply)
		v.gate.Refused(caller, "reply", "reply subject outside the caller's inbox")
		return
	}
	if !isAdmin(caller) {
		if ok, tell := v.gate.Allow(caller); !ok {
			if v.cfg.RateLimited != nil {
				v.cfg.RateLimited(verb)
			}
			if tell { // once a second; the others are dropped, so a flood costs no replies
				b, _ := json.Marshal(api.VaultReply{Error: fmt.Sprintf("%s: too many vault requests (more than %d a second, the node's rate-limit); slow down and retry", caller, v.cfg.RateLimit)})
				m.Respond(b)
			}
			return
		}
	}
	var req api.VaultRequest
	var reply api.VaultReply
	var events []event
	if err := json.Unmarshal(m.Data, &req); err != nil {
		reply.Error = "the request is not JSON"
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		reply, events = v.handle(ctx, verb, caller, req)
		cancel()
	}
	b, _ := json.Marshal(reply)
	m.Respond(b)
	if v.cfg.Served != nil {
		v.cfg.Served(verb, reply.Error != "", time.Since(arrived))
	}
	// The audit events go after the reply, off the caller's round trip: a worker publishes
	// each with the stream's ack awaited, and logs a failure loudly.
	v.queue(events...)
}

// mayReply reports whether reply is the caller's to hear. A module's answers go to its own
// inbox (_INBOX.<module>.…) and a join token's to its key's (_INBOX.<key>.…): nobody can make
// the vault answer into another identity's inbox. The operator and the nodes, who
// administer, may name any inbox.
func (v *Vault) mayReply(caller, reply string) bool {
	if !strings.HasPrefix(reply, "_INBOX.") {
		return false // the responder could not publish it anyway
	}
	if isAdmin(caller) {
		return true
	}
	if module, ok := strings.CutPrefix(caller, "mod."); ok {
		return manifest.InInbox(reply, manifest.InboxPrefix(module))
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	for pub, t := range v.tokens {
		if t.ID == caller {
			return manifest.InInbox(reply, manifest.BootstrapInbox(pub))
		}
	}
	return false
}

// isAdmin reports whether caller administers the vault: the operator or a node.
func isAdmin(caller string) bool {
	return caller == api.VaultCallerOperator || caller == api.VaultCallerNode
}

// serverXKey reports whether xkey is the recorded xkey of server node.
func (v *Vault) serverXKey(node, xkey string) bool {
	if v.cfg.ServerXKey == nil || node == "" {
		return false
	}
	want, ok := v.cfg.ServerXKey(node)
	return ok && want == xkey
}

// event is one vault action to record; or, when flush names a record, the events its outbox
// holds.
type event struct {
	action string
	meta   map[string]any
	flush  string
}

func (v *Vault) handle(ctx context.Context, verb, caller string, req api.VaultRequest) (api.VaultReply, []event) {
	var events []event
	ctx = context.WithValue(ctx, eventsKey{}, &events)
	admin := isAdmin(caller)
	module, isModule := strings.CutPrefix(caller, "mod.")
	var out any
	var meta []api.VaultMeta
	var err error
	var reply api.VaultReply
	switch {
	case verb != api.VaultVerbList && verb != api.VaultVerbEnrol && verb != api.VaultVerbIntake && !nodeOnly(verb) && !nkeys.IsValidPublicCurveKey(req.XKey):
		// Checked first, so nothing is written for a reply that could not be sealed.
		err = errors.New("the request carries no xkey to seal the reply to: send your xkey public key (nkeys CreateCurveKeys) as xkey")
	case (verb == api.VaultVerbMint || verb == api.VaultVerbRotate || verb == api.VaultVerbFetch) && strings.HasPrefix(req.Name, reservedPrefix):
		err = fmt.Errorf("secret %s of %s is the mesh's own (%s* names are kept for it)", req.Name, req.Owner, reservedPrefix)
	case verb == api.VaultVerbEnrol:
		out, err = v.enrol(ctx, caller, req)
	case verb == api.VaultVerbFetch && isModule:
		// A module fetches its own secrets, and only those its manifest names.
		req.Owner = module
		names, ok := v.cfg.Secrets(module)
		if !ok || !slices.Contains(names, req.Name) {
			err = fmt.Errorf("module %s does not declare secret %q (it declares %v); add it to secrets: in its manifest and re-register", module, req.Name, names)
		} else {
			out, err = v.fetch(ctx, req)
		}
	case !admin:
		err = fmt.Errorf("%s may only fetch its own secrets", caller)
	case verb == api.VaultVerbFetch:
		out, err = v.fetch(ctx, req)
	case verb == api.VaultVerbMint:
		out, err = v.mint(ctx, req)
	case verb == api.VaultVerbRotate:
		out, err = v.rotate(ctx, req)
	case verb == api.VaultVerbList:
		meta, err = v.list(ctx, req.Owner)
	case verb == api.VaultVerbToken:
		out, err = v.token(ctx, req)
	case verb == api.VaultVerbIdentity:
		out, err = v.identity(ctx, req)
	case nodeOnly(verb) && caller != api.VaultCallerNode:
		err = fmt.Errorf("only the nodes (the controller's holder) %s provisions", verb)
	case verb == api.VaultVerbIntake && admin:
		reply.PublicKey, _ = v.intake.PublicKey()
	case verb == api.VaultVerbProvision:
		meta, err = v.keepProvision(ctx, req)
	case verb == api.VaultVerbUnprovision:
		err = v.dropProvision(ctx, req)
	case verb == api.VaultVerbModule && (caller != api.VaultCallerNode || !v.serverXKey(req.Node, req.XKey)):
		err = fmt.Errorf("a module's credentials are sealed only to the recorded xkey of the server that runs it, and %q is not server %q's", req.XKey, req.Node)
	case verb == api.VaultVerbModule:
		out, err = v.moduleCredentials(ctx, req)
	case verb == api.VaultVerbServer && caller != api.VaultCallerNode:
		err = errors.New("only a server of the mesh receives the vault's credentials")
	case verb == api.VaultVerbServer && !v.serverXKey(req.Node, req.XKey):
		err = fmt.Errorf("%q is not the recorded xkey of server %q: the vault's credentials are sealed only to a server's own key", req.XKey, req.Node)
	case verb == api.VaultVerbServer:
		seed, serr := v.cfg.Key.Seed()
		if serr != nil {
			err = serr
			break
		}
		out = &api.ServerSecrets{BarrierKey: v.cfg.BarrierKey, VaultSeed: seed}
		v.event(ctx, "server-enrolled", map[string]any{"node": req.Node})
	case (verb == api.VaultVerbRecoveryKey || verb == api.VaultVerbFoundation) && caller != api.VaultCallerOperator:
		err = fmt.Errorf("only the operator receives the mesh's %s (a snapshot restores with it)", verb)
	case verb == api.VaultVerbRecoveryKey:
		out = &api.RecoveryKey{MeshID: v.cfg.MeshID, Key: recovery.EncodeKey(v.cfg.BarrierKey)}
		v.event(ctx, "recovery-key-read", map[string]any{})
	case verb == api.VaultVerbFoundation:
		out, err = v.SealedFoundation()
	default:
		err = fmt.Errorf("unknown vault verb %q", verb)
	}
	if err != nil {
		if admin {
			// The operator and the nodes are no flood: each of their refusals is recorded.
			events = append(events, event{action: "refused", meta: map[string]any{"verb": verb, "caller": caller, "owner": req.Owner, "name": req.Name, "reason": err.Error()}})
			return api.VaultReply{Error: err.Error()}, events
		}
		// Counted, and recorded as one event per caller and verb per interval: a flood of
		// refused requests must not become a flood of events and audit records.
		v.gate.Refused(caller, verb, err.Error())
		return api.VaultReply{Error: err.Error()}, events
	}
	reply.Meta = meta
	if id, ok := out.(*api.Identity); ok {
		reply.PublicKey = id.PublicKey
	}
	if out != nil {
		plain, _ := json.Marshal(out)
		if reply.Sealed, reply.Sender, err = Seal(req.XKey, plain); err != nil {
			return api.VaultReply{Error: fmt.Sprintf("%v: send your xkey public key (nkeys CreateCurveKeys) as xkey", err)}, events
		}
	}
	return reply, events
}

// SealedFoundation is the mesh's foundation — the route secret and gossip key (the
// enrolment's) and the vault's seed — sealed under the barrier key, for a snapshot: the
// file carries it, and only the recovery key opens it. The node's scheduled snapshots take
// it here, in process, as the operator's save takes it over the bus. On a nil Vault (a
// server not yet enrolled with the vault's credentials) it says so.
func (v *Vault) SealedFoundation() (*api.SealedFoundation, error) {
	if v == nil {
		return nil, errors.New("this server does not hold the vault's credentials yet (it asks the vault for them at start), so it cannot seal the mesh's foundation: wait for it to enrol, or have a server that serves the vault hold mesh-controller")
	}
	if v.cfg.Enrolment == nil {
		return nil, errors.New("this vault serves no enrolment, so it does not know the mesh's route secret and gossip key")
	}
	e := v.cfg.Enrolment()
	seed, err := v.cfg.Key.Seed()
	if err != nil {
		return nil, err
	}
	return recovery.Seal(v.cfg.BarrierKey, v.cfg.MeshID, recovery.Foundation{RouteSecret: e.RouteSecret, GossipKey: e.GossipKey, VaultSeed: seed})
}

type eventsKey struct{}

// event notes a vault action to record once the request is answered: metadata, never a
// value.
func (v *Vault) event(ctx context.Context, action string, meta map[string]any) {
	if events, ok := ctx.Value(eventsKey{}).(*[]event); ok {
		*events = append(*events, event{action: action, meta: meta})
		return
	}
	v.queue(event{action: action, meta: meta})
}

// flushLater asks for the events in key's outbox to be published once the request is
// answered.
func (v *Vault) flushLater(ctx context.Context, key string) {
	if events, ok := ctx.Value(eventsKey{}).(*[]event); ok {
		*events = append(*events, event{flush: key})
		return
	}
	v.queue(event{flush: key})
}

// publish records one vault action on the mesh-vault seat's events.
func (v *Vault) publish(e event) {
	e.meta["node"] = v.cfg.Node
	body, _ := json.Marshal(e.meta)
	// A new event (no id yet), published as a waiting one is, but not kept for a retry.
	if err := v.publishEvent(v.recordCtx, outbox.Event{Action: e.action, Body: body}); err != nil {
		v.log.Error("vault event not recorded", "action", e.action, "err", err)
	}
}

func randomValue() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
