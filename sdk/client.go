package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/toolstats"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/nats-io/nuid"
)

// Errors a module meets. Each returned error wraps one of these and says what to do.
var (
	// ErrNotDeclared means the call needs a declaration the module's manifest lacks.
	ErrNotDeclared = errors.New("not declared in the module's manifest")
	// ErrPermission means the bus refused the operation (a permissions violation).
	ErrPermission = errors.New("refused by the bus")
	// ErrUnknownKey means the bus does not know the seed's key as a module.
	ErrUnknownKey = errors.New("key is not a registered module")
	// ErrNoResponders means nobody answers a tool call.
	ErrNoResponders = errors.New("no responders")
	// ErrNoQueue means a seat declared by a registered module has no work queue (it went
	// missing: the node remakes it), or no stream captures an event: nothing answered the
	// job or event, sent again with a back-off for 5 s (or until its context ended), the
	// node's admitter included (it is away for a moment when the server cut it off for
	// falling behind; the sdk waits that out).
	ErrNoQueue = errors.New("seat has no work queue")
	// ErrUndeclaredSeat means no registered module declares the seat yet, so it has no work
	// queue to take a job.
	ErrUndeclaredSeat = errors.New("seat declared by no registered module")
	// ErrIncomplete means a seat's protocol lacks a handler: a holder implements all of it.
	ErrIncomplete = errors.New("seat protocol incomplete")
	// ErrNotHolder means this instance does not hold the seat it would act for.
	ErrNotHolder = errors.New("not the seat's holder")
	// ErrOverQuota means the module holds more of EVENTS than its quota: the bus refuses its
	// emits until its oldest events age out or the operator raises the quota.
	ErrOverQuota = errors.New("over the module's EVENTS quota")
	// ErrBackPressure means the node's admitter kept refusing an event or job retryably (the
	// mesh's audit log behind, or the module past its pace, emit-rate) until the context
	// ended: nothing was stored; the same event may be sent again.
	ErrBackPressure = errors.New("the mesh asked to slow down")
)

// DefaultRetryBackoff is the delay before each retry of a failed handler, one step per
// delivery (the last step repeats).
var DefaultRetryBackoff = []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second}

// Option configures Connect.
type Option func(*options)

type options struct {
	log    *slog.Logger
	retry  []time.Duration
	window time.Duration
	clock  func() time.Time
	shapes bool
	ca     string // the mesh's CA certificate file; "": MESH_CA, if set
	module string // the module the seed is registered as; "": MESH_MODULE, if set
	// authPatience is how long the key may be refused before the client gives up.
	authPatience time.Duration
}

// WithAuthPatience sets how long the client goes on reconnecting while the node refuses the
// module's key (default AuthPatience) before it closes the connection.
func WithAuthPatience(d time.Duration) Option { return func(o *options) { o.authPatience = d } }

// AsModule names the module the seed is registered as, so that Connect needs one connection:
// it asks the bus which module the seed is on the module's own connection (and refuses a
// name that is not the seed's). Without it Connect takes MESH_MODULE (set for the modules a
// node runs) as a hint, and a wrong one costs a second connect; with neither, it asks first
// on a short-lived connection of its own, which costs a second connect.
func AsModule(name string) Option { return func(o *options) { o.module = name } }

// RootCA makes the client trust the mesh's CA certificate in file (a node's
// <data-dir>/ca.pem), to verify a node whose client port is TLS. Without it, the client
// trusts the file MESH_CA names (set for the modules a node runs); "" changes nothing.
func RootCA(file string) Option {
	return func(o *options) {
		if file != "" {
			o.ca = file
		}
	}
}

// rootCA is the nats option of the CA the client trusts, if any.
func (o options) rootCA() nats.Option {
	ca := o.ca
	if ca == "" {
		ca = os.Getenv("MESH_CA")
	}
	if ca == "" {
		return func(*nats.Options) error { return nil }
	}
	return TrustCA(ca)
}

// TrustCA is the nats option that verifies a TLS client port against the mesh's CA
// certificate in file. A node off loopback must speak TLS (a plain answer there could be
// someone in between, stripping it); one on loopback may be plain.
func TrustCA(file string) nats.Option {
	return func(o *nats.Options) error {
		pool, err := meshca.RootCAs(file)
		if err != nil {
			return err
		}
		meshca.ClientOptions(o, pool)
		return nil
	}
}

// WithLogger sets the logger for background problems (a handler error, a lost connection).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithClock makes the client stamp its events' ids and x-time with now's time instead of the
// machine's: a test's way to run a module whose clock is off (the chaos harness skews one),
// and see the consumers' replay window judge it.
func WithClock(now func() time.Time) Option { return func(o *options) { o.clock = now } }

// WithRetryBackoff sets the delays before each retry of a failed handler.
func WithRetryBackoff(d ...time.Duration) Option {
	return func(o *options) { o.retry = slices.Clone(d) }
}

// Client is a module's connection to its node's bus.
type Client struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	key    *envelope.SigningKey // signs envelopes
	pub    string
	log    *slog.Logger
	retry  []time.Duration
	window time.Duration    // the replay window of the checks (check.go)
	clock  func() time.Time // nil: the machine's (WithClock)
	shapes bool             // check the payloads sent to seats against their shapes (shape.go)
	// firstAckWait overrides ackWaitFirst (emit.go): tests shorten it.
	firstAckWait time.Duration

	stats        toolstats.Recorder // how long its tool handlers take (report.go)
	reporting    sync.WaitGroup     // the stats reporter
	reportOnce   sync.Once          // starts it, with the first tool served
	refusedSince atomic.Int64       // unix ns of the first refusal of the key since the last connect; 0: none
	authPatience time.Duration      // how long a refused key is tried again

	ctx    context.Context // ended by Close; handlers receive it
	cancel context.CancelFunc

	instance string               // this connection's name: the unit that holds a seat
	xkeyOnce sync.Once            // xkeys makes the xkey on first use
	xkey     *vault.CachingOpener // this client's xkey: what the vault seals its replies to
	xpub     string
	xkeyErr  error

	mu   sync.Mutex
	self api.WhoamiReply
	// signersKnown is when the question behind self's keys was asked; signersTried when
	// whoami was last asked for keys, answered or not. refreshMu lets one question out at a
	// time.
	signersKnown, signersTried time.Time
	refreshMu                  sync.Mutex
	seats                      map[string]*seatState
	handlers                   []handler
	consume                    *consumption
	subs                       []*nats.Subscription

	refusals *Refusals // fed by asyncError: ends a refused request at once

	pipeline pipeline // EmitAsync's (pipeline.go)

	// connCtx lives while the connection is up: a request to this node that must not outlive
	// it (nats.go keeps a request through a reconnect until its timeout) derives from it.
	connMu  sync.Mutex
	connCtx context.Context
	connEnd context.CancelFunc

	// consuming counts running consumptions (startConsuming), which end with ctx.
	consuming sync.WaitGroup
	// wg counts running handlers; closing guards its Add against Close's Wait.
	wg      sync.WaitGroup
	closing sync.RWMutex
	closed  bool
}

// track registers a running handler; false once the client is closing (the delivery is
// then left unacked, and JetStream redelivers it).
func (c *Client) track() bool {
	c.closing.RLock()
	defer c.closing.RUnlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

// Connect connects to the bus at url as the module whose nkey seed is in seedFile. It asks
// the bus which module the seed is, then connects as that module with its own inbox.
func Connect(ctx context.Context, url, seedFile string, opts ...Option) (*Client, error) {
	o := options{log: slog.New(slog.DiscardHandler), retry: DefaultRetryBackoff, window: DefaultReplayWindow, authPatience: AuthPatience}
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.retry) == 0 {
		o.retry = DefaultRetryBackoff
	}
	raw, err := os.ReadFile(seedFile)
	if err != nil {
		return nil, fmt.Errorf("read seed: %w", err)
	}
	kp, err := nkeys.ParseDecoratedNKey(raw)
	if err != nil {
		return nil, fmt.Errorf("seed file %s: %w; it should hold the seed written by `meshnode module register --creds-out`", seedFile, err)
	}
	// One expansion of the seed: nkeys' key pair expands it again for each signature and
	// each PublicKey, the connect's nonce included.
	key, err := envelope.NewSigningKey(kp)
	if err != nil {
		return nil, err
	}
	pub, err := key.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("seed file %s: %w", seedFile, err)
	}
	// Named: one connection, and whoami asked on it. A refused inbox (the seed is another
	// module's) or another answer falls back to asking first; a name given with AsModule
	// must then be the seed's, while MESH_MODULE, inherited by whatever a module starts, is
	// a hint only.
	named := o.module
	if named == "" {
		named = os.Getenv("MESH_MODULE")
	}
	if named != "" {
		c, err := dialModule(ctx, url, pub, key, o, api.WhoamiReply{Module: named})
		if err == nil {
			self, err := askWhoamiWatched(ctx, c, pub)
			if err == nil && self.Module == named {
				c.mu.Lock()
				c.self = self
				c.mu.Unlock()
				return c, nil
			}
			c.close()
		}
	}
	self, err := whoami(ctx, url, key, pub, o.rootCA())
	if err != nil {
		return nil, err
	}
	if o.module != "" && self.Module != o.module {
		return nil, fmt.Errorf("the seed in %s is module %s's, not %s's (sdk.AsModule): connect without the name, or with the seed of %s", seedFile, self.Module, o.module, o.module)
	}
	return dialModule(ctx, url, pub, key, o, self)
}

// dialModule makes the client of module self.Module on its own connection, with what it
// knows of itself so far.
func dialModule(ctx context.Context, url, pub string, key *envelope.SigningKey, o options, self api.WhoamiReply) (*Client, error) {
	c := &Client{key: key, pub: pub, log: o.log.With("module", self.Module), retry: o.retry, window: o.window, clock: o.clock, shapes: o.shapes, authPatience: o.authPatience, self: self,
		instance: self.Module + "-" + nuid.Next(), refusals: NewRefusals(manifest.InboxPrefix(self.Module))}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.connCtx, c.connEnd = context.WithCancel(c.ctx)
	var err error
	c.nc, err = nats.Connect(url,
		o.rootCA(),
		nats.Nkey(pub, key.Sign),
		nats.CustomInboxPrefix(manifest.InboxPrefix(self.Module)),
		nats.Name(c.instance),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		// A starting node holds a connect until it has read its registry, but a module
		// registered through another node may reach this one before its record does:
		// nats.go would give up for good at the second refusal in a row. A key refused for
		// longer than AuthPatience is given up (asyncError).
		nats.IgnoreAuthErrorAbort(),
		nats.ErrorHandler(c.asyncError),
		nats.ReconnectHandler(c.reconnected),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { c.disconnected() }),
		// A module talks to its own node: in a cluster the server advertises the others,
		// and a reconnect elsewhere would move the instance's seat candidacy with it.
		nats.IgnoreDiscoveredServers(),
	)
	if err != nil {
		c.cancel()
		return nil, connectError(url, pub, err)
	}
	c.js, _ = jetstream.New(c.nc)
	return c, nil
}

// askWhoamiWatched is askWhoami on the client's own connection, ended at once if the bus
// refuses its inbox (the client was named for another module).
func askWhoamiWatched(ctx context.Context, c *Client, pub string) (api.WhoamiReply, error) {
	ctx, stop := c.watch(ctx, "")
	defer stop()
	return askWhoami(ctx, c.nc, pub, true)
}

// close ends a client Connect made and will not return.
func (c *Client) close() {
	c.nc.Close()
	c.cancel()
}

// xkeys returns the client's xkey, what the vault seals its replies to, made on first use:
// an X25519 key costs a connect a tenth of its time, and most modules fetch no secret.
func (c *Client) xkeys() (*vault.CachingOpener, string, error) {
	c.xkeyOnce.Do(func() {
		kp, err := nkeys.CreateCurveKeys()
		if err == nil {
			c.xpub, err = kp.PublicKey()
		}
		c.xkey, c.xkeyErr = vault.NewCachingOpener(kp), err
	})
	return c.xkey, c.xpub, c.xkeyErr
}

// whoami asks the bus which module pub is, on a short-lived connection whose inbox is named
// for the key (the only inbox a client that does not know its name may use).
func whoami(ctx context.Context, url string, key *envelope.SigningKey, pub string, ca nats.Option) (api.WhoamiReply, error) {
	nc, err := nats.Connect(url, ca, nats.Nkey(pub, key.Sign), nats.CustomInboxPrefix(api.BootstrapInbox(pub)),
		nats.Name("whoami"), nats.MaxReconnects(0))
	if err != nil {
		return api.WhoamiReply{}, connectError(url, pub, err)
	}
	defer nc.Close()
	return askWhoami(ctx, nc, pub, true)
}

// How long a connect's whoami waits for its answer before it asks again: whoamiWaitFirst,
// doubling to whoamiWaitMost. The controller answers in a millisecond or two.
const (
	whoamiWaitFirst = 2 * time.Second
	whoamiWaitMost  = 10 * time.Second
)

// askWhoami asks the controller which module pub is. patient: a connect's, which waits out a
// moment with no controller and asks again when an answer does not come; a refresh (after a
// reconnect, before a seat job) asks once.
func askWhoami(ctx context.Context, nc *nats.Conn, pub string, patient bool) (api.WhoamiReply, error) {
	return askWhoamiWaiting(ctx, nc, pub, patient, whoamiWaitFirst)
}

// askWhoamiWaiting is askWhoami with the first wait before a connect asks again.
func askWhoamiWaiting(ctx context.Context, nc *nats.Conn, pub string, patient bool, try time.Duration) (api.WhoamiReply, error) {
	var self api.WhoamiReply
	req, _ := json.Marshal(api.WhoamiRequest{PublicKey: pub})
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	subject := api.WhoamiSubject(pub)
	ask := func() (*nats.Msg, error) {
		if !patient {
			return nc.RequestWithContext(ctx, subject, req)
		}
		// A request can be lost on its way, with nobody to say so: a site's request crossing
		// its leafnode link while the link's interest is still being exchanged (seen once, in
		// a loaded CI run: a connect through a site waited its whole 2 minutes). whoami is
		// only a question, so a connect asks again after whoamiWaitFirst, doubling.
		for {
			actx, acancel := context.WithTimeout(ctx, try)
			msg, err := nc.RequestWithContext(actx, subject, req)
			lost := unanswered(err, actx, ctx)
			acancel()
			if !lost {
				return msg, err
			}
			try = min(2*try, whoamiWaitMost)
		}
	}
	msg, err := ask()
	// Nobody answers while the controller's seat moves (its holder died, or was starved past
	// its lease): a connect asks again until the next holder answers or ctx ends.
	wait := backoff.Backoff{First: 50 * time.Millisecond, Max: time.Second}
	for patient && errors.Is(err, nats.ErrNoResponders) && wait.Wait(ctx) == nil {
		if msg, err = ask(); err != nil && ctx.Err() != nil {
			err = nats.ErrNoResponders // ctx ended as it asked again: nobody had answered
		}
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return self, fmt.Errorf("%w: no controller answers %s; is the node ready (`meshnode status`)?", ErrNoResponders, api.WhoamiSubject(pub))
	}
	if err != nil {
		return self, fmt.Errorf("ask the mesh's controller who %s is: %w; is this node cut off from the majority of the mesh (`meshnode members`), or still starting?", pub, err)
	}
	if err := json.Unmarshal(msg.Data, &self); err != nil {
		return self, fmt.Errorf("whoami answered %q: %w", msg.Data, err)
	}
	if self.Error != "" {
		return self, fmt.Errorf("%w: %s", ErrUnknownKey, self.Error)
	}
	return self, nil
}

func connectError(url, pub string, err error) error {
	if errors.Is(err, nats.ErrAuthorization) {
		return fmt.Errorf("%w: the bus at %s refused key %s: it is not registered, or was removed; register the module with `meshnode module register`",
			ErrUnknownKey, url, pub)
	}
	return fmt.Errorf("connect to %s: %w", url, err)
}

// Instance is this connection's name, unique per Connect: the unit that holds a seat.
func (c *Client) Instance() string { return c.instance }

// Module is the module's name.
func (c *Client) Module() string { return c.declared().Module }

// declared returns what the module declared, as the bus last said.
func (c *Client) declared() api.WhoamiReply {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.self
}

// Conn is the underlying NATS connection, for what the sdk does not cover. Its permissions
// are the module's: the bus refuses anything undeclared.
func (c *Client) Conn() *nats.Conn { return c.nc }

// node is the node the client is connected to: the server's name is the node's.
func (c *Client) node() string {
	if n := c.nc.ConnectedServerName(); n != "" {
		return n
	}
	return c.declared().Node
}

// Close stops handlers and subscriptions, waits for running handlers, and closes the
// connection after flushing what was published.
func (c *Client) Close() error {
	if c.nc.IsConnected() {
		c.report(false)  // the tools' latency since the last report, while the bus still takes it
		c.releaseSeats() // else the node frees them when it sees the connection gone
	}
	// Then the handlers: what they emit is part of what is flushed.
	c.mu.Lock()
	if c.consume != nil {
		c.consume.Stop()
	}
	for _, s := range c.subs {
		s.Unsubscribe()
	}
	c.mu.Unlock()
	c.closing.Lock()
	c.closed = true
	c.closing.Unlock()
	c.cancel()
	c.consuming.Wait()
	c.wg.Wait()
	c.reporting.Wait()
	// Events EmitAsync sent get their answers (a little while): their failures, and those of
	// the ones still unanswered when the connection closes, are Close's error.
	if c.pipeline.used.Load() && c.nc.IsConnected() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c.flushAnswers(ctx)
		cancel()
	}
	var err error
	if c.nc.IsConnected() {
		err = c.nc.FlushTimeout(2 * time.Second)
	}
	if errors.Is(err, nats.ErrConnectionClosed) {
		// A released seat's node kicks its holder's connection; there was nothing left to
		// flush on it.
		err = nil
	}
	c.nc.Close()
	c.abandonInflight() // nats.go settles no pending ack of a closed connection
	return errors.Join(c.failures(), err)
}

// AuthPatience is how long the sdk goes on reconnecting while the node refuses the module's
// key: far longer than a registration takes to reach every node. (A restarting node refuses
// nobody it has not read yet: it holds their connects until it has read its registry.)
const AuthPatience = 2 * time.Minute

// reconnected refreshes what the module declared: the bus kicks a module's connections when
// its registration changes, and they come back under the new authority.
func (c *Client) reconnected(nc *nats.Conn) {
	c.refusedSince.Store(0)
	c.connMu.Lock()
	c.connEnd()
	c.connCtx, c.connEnd = context.WithCancel(c.ctx)
	c.connMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	self, err := askWhoami(ctx, nc, c.pub, false)
	if err != nil {
		c.log.Warn("refresh declarations after reconnect; keeping the last ones", "err", err)
	} else {
		c.mu.Lock()
		c.self = self
		c.mu.Unlock()
	}
	c.reclaim() // a seat's holder must come back to its queue either way
}

// asyncError hands permission violations to the requests waiting on them, so a refused call
// fails at once and says the bus refused it.
func (c *Client) asyncError(nc *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrAuthorization) {
		now := time.Now().UnixNano()
		if c.refusedSince.CompareAndSwap(0, now) {
			c.log.Warn("the node refuses this module's key; trying again (a registration made through another node takes a moment to reach this one)", "err", err)
			return
		}
		if since := time.Duration(now - c.refusedSince.Load()); since > c.authPatience {
			c.log.Error("the node has refused this module's key for longer than a registration takes to reach it: the module was removed, or its key was rotated; the connection is closed",
				"refused_for", since.Round(time.Second))
			go nc.Close() // not from nats.go's callback goroutine
		}
		return
	}
	c.refusals.Handle(err)
	if r := AsRefusal(err); r != nil && strings.HasPrefix(r.Subject, "_INBOX.") && r.Op == RefusedPublish {
		// A tool's answer to an inbox the bus does not let this module answer into: the
		// caller is waiting in vain, and only this side sees why.
		c.log.Warn("a tool's answer was refused: a module answers its tools only into the operator's inbox, a seat's holder into its users'; the caller must use inbox prefix "+manifest.OperatorInbox+" (NATS CLI: --inbox-prefix "+manifest.OperatorInbox+")",
			"reply", r.Subject)
		return
	}
	c.log.Warn("bus error", "err", err)
}

// refusal returns the bus's permission violation for subject, if it was the connection's
// last error: nats.go records it before it reads the server's next answer, so after a Flush
// it covers what was sent before (a subscription, which no request waits on).
func (c *Client) refusal(subject string) error {
	if r := AsRefusal(c.nc.LastError()); r != nil && r.Subject == subject {
		return r
	}
	return nil
}

// watch returns ctx, ended at once with the bus's refusal as its cause if the bus refuses a
// publish to subject or a reply to the client's inbox; stop releases it.
func (c *Client) watch(ctx context.Context, subject string) (context.Context, context.CancelFunc) {
	return c.refusals.Watch(ctx, subject)
}

// Refusal is the bus's refusal of one operation: a permissions violation. The server reports
// it asynchronously, and nats.go hands it only to the connection's error handler while a
// request waits for its timeout; Refusals turns it into the request's error. A Refusal wraps
// both ErrPermission and nats.ErrPermissionViolation.
type Refusal struct {
	// Op is what was refused: RefusedPublish, RefusedSubscribe or RefusedReply.
	Op string
	// Subject is the subject refused (the reply subject, for a refused reply).
	Subject string
	err     error
}

// What a Refusal refused (its Op).
const (
	RefusedPublish   = "publish to"
	RefusedSubscribe = "subscribe to"
	RefusedReply     = "reply through"
)

func (r *Refusal) Error() string {
	return fmt.Sprintf("%v: may not %s %s", ErrPermission, r.Op, r.Subject)
}

// Unwrap makes a Refusal both ErrPermission and nats.ErrPermissionViolation.
func (r *Refusal) Unwrap() []error { return []error{ErrPermission, r.err} }

// AsRefusal reads a permissions violation as nats.go reports it (to an error handler, or as
// the connection's LastError); nil when err is not one. It is told by type; the subject comes
// from the server's text, which is the only place nats-server puts it ("Permissions Violation
// for Publish to %q", "for Subscription to %q", "for Publish with Reply of %q"), as nats.go
// itself reads it.
func AsRefusal(err error) *Refusal {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	text := err.Error()
	r = &Refusal{Op: RefusedPublish, Subject: "(a subject the server did not name)", err: err}
	i := strings.IndexByte(text, '"')
	if i < 0 {
		return r
	}
	if quoted, qerr := strconv.QuotedPrefix(text[i:]); qerr == nil {
		r.Subject, _ = strconv.Unquote(quoted)
	}
	switch before := text[:i]; {
	case strings.HasSuffix(before, "Subscription to "):
		r.Op = RefusedSubscribe
	case strings.HasSuffix(before, "Reply of "):
		r.Op = RefusedReply
	}
	return r
}

// Refusals ends the requests of one connection as soon as the bus refuses them. Hand it the
// connection's asynchronous errors (Handle, from a nats.ErrorHandler) and run each request
// under a context from Watch. The sdk's Client does this for every request it makes; a
// module's own requests on Conn(), or a tool's, can do the same.
type Refusals struct {
	inbox string // the connection's inbox prefix: a refusal under it concerns every reply

	mu    sync.Mutex
	waits map[*refusalWait]struct{}
}

type refusalWait struct {
	subject string // "": any refusal on the connection
	cancel  context.CancelCauseFunc
}

// NewRefusals returns Refusals for a connection whose inbox prefix is inbox (nats.go's
// default is "_INBOX").
func NewRefusals(inbox string) *Refusals {
	return &Refusals{inbox: inbox, waits: map[*refusalWait]struct{}{}}
}

// Handle ends the requests that err refuses, if it is a permissions violation, and reports
// whether it was one.
func (r *Refusals) Handle(err error) bool {
	ref := AsRefusal(err)
	if ref == nil {
		return false
	}
	reply := ref.Op != RefusedPublish && r.inbox != "" && strings.HasPrefix(ref.Subject, r.inbox+".")
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.waits {
		if w.subject == "" || w.subject == ref.Subject || reply {
			w.cancel(ref)
			delete(r.waits, w)
		}
	}
	return true
}

// Watch returns ctx, ended with the bus's refusal as its cause (see Refused) when the bus
// refuses subject, or a subscription (or reply subject) in the connection's inbox, where
// every request's reply comes; subject "" watches for any refusal on the connection (one
// connection per job). stop releases the context.
func (r *Refusals) Watch(ctx context.Context, subject string) (_ context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	unwatch := r.watch(subject, cancel)
	return ctx, func() {
		unwatch()
		cancel(nil)
	}
}

// watch calls cancel with the bus's refusal of subject (as Watch), until stop.
func (r *Refusals) watch(subject string, cancel context.CancelCauseFunc) (stop func()) {
	w := &refusalWait{subject: subject, cancel: cancel}
	r.mu.Lock()
	r.waits[w] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.waits, w)
		r.mu.Unlock()
	}
}

// Refused returns the bus's refusal that ended ctx, a context from Watch, or nil.
func Refused(ctx context.Context) *Refusal {
	var r *Refusal
	if errors.As(context.Cause(ctx), &r) {
		return r
	}
	return nil
}

// waitContext is ctx for the requests to subject and their waits (the sends of one event or
// job, a question about a seat): ended with the bus's refusal of subject as its cause (Refused
// reads it) and as soon as the connection drops (dropped says whether it did), with deadline
// ctx's own or defaultWait from now, for each send's context to keep to. One context and two
// registrations: layered contexts (a timeout, the connection's, a refusal's watch) cost every
// Emit 5 µs and 25 allocations.
func (c *Client) waitContext(ctx context.Context, subject string) (_ context.Context, deadline time.Time, dropped func() bool, end func()) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultWait)
	}
	c.connMu.Lock()
	conn := c.connCtx
	c.connMu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	unwatch := c.refusals.watch(subject, cancel)
	stop := context.AfterFunc(conn, func() { cancel(nil) })
	return ctx, deadline, func() bool { return conn.Err() != nil }, func() { stop(); unwatch(); cancel(nil) }
}

// defaultWait bounds a wait whose context has no deadline.
const defaultWait = 10 * time.Second

// withDefaultTimeout bounds ctx by 10s when it has no deadline of its own.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultWait)
}

// encode turns a payload into the body: []byte and json.RawMessage as they are, nil as an
// empty body, anything else as JSON.
func encode(payload any) ([]byte, error) {
	switch p := payload.(type) {
	case nil:
		return nil, nil
	case []byte:
		return p, nil
	case json.RawMessage:
		return p, nil
	case string:
		return []byte(p), nil
	}
	b, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("encode payload: %w", err)
	}
	return b, nil
}

// Event is a delivered event: its typed envelope, its payload, and the key
// "<emitter>.<event>" its manifest name.
type Event = envelope.Event
