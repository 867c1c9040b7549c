package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// bed is a real node with an operator connection, for the integration beds of issue 4.
type bed struct {
	t       testing.TB
	n       *runningNode
	dir     string
	op      *nats.Conn
	js      jetstream.JetStream
	clients []*sdk.Client
}

func newBed(t testing.TB) *bed {
	t.Helper()
	return newBedAt(t, testConfig(t.TempDir(), "alpha"))
}

// newBedAt is newBed on a given configuration (to restart a node on its data dir).
func newBedAt(t testing.TB, cfg config.Config) *bed {
	t.Helper()
	dir := cfg.DataDir
	n := MustOpenNode(t, cfg)
	op := connect(t, n.ClientURL(), filepath.Join(dir, datadir.OperatorSeedFile), nats.CustomInboxPrefix(manifest.OperatorInbox))
	t.Cleanup(op.Close)
	js, _ := jetstream.New(op)
	return &bed{t: t, n: n, dir: dir, op: op, js: js}
}

// close stops the bed's node before the test ends (benchmarks run several in a row).
func (b *bed) close() {
	for _, c := range b.clients {
		c.Close()
	}
	b.op.Close()
	b.n.stop()
}

// operatorConn opens another operator connection.
func (b *bed) operatorConn() *nats.Conn {
	return connect(b.t, b.n.ClientURL(), filepath.Join(b.dir, datadir.OperatorSeedFile), nats.CustomInboxPrefix(manifest.OperatorInbox))
}

// eventsOn returns how many messages EVENTS holds on subject.
func eventsOn(t *testing.T, b *bed, subject string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	events, err := b.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := events.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// register registers a manifest and writes the new module's seed to a file.
func (b *bed) register(yamlText string) (seedFile string, reg *admin.Registered) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := admin.Register(ctx, b.op, []byte(yamlText))
	if err != nil {
		b.t.Fatalf("register: %v", err)
	}
	seedFile = filepath.Join(b.t.TempDir(), reg.Module+".nk")
	if reg.Created {
		if err := os.WriteFile(seedFile, reg.Seed, 0o600); err != nil {
			b.t.Fatal(err)
		}
	}
	return seedFile, reg
}

// client connects a module through the sdk.
func (b *bed) client(seedFile string, opts ...sdk.Option) *sdk.Client {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdk.Connect(ctx, b.n.ClientURL(), seedFile, opts...)
	if err != nil {
		b.t.Fatalf("sdk.Connect: %v", err)
	}
	b.t.Cleanup(func() { c.Close() })
	b.clients = append(b.clients, c)
	return c
}

// raw connects a module as a plain NATS client would: its seed and its inbox prefix.
func (b *bed) raw(seedFile, module string) *nats.Conn {
	b.t.Helper()
	nc := connect(b.t, b.n.ClientURL(), seedFile, nats.CustomInboxPrefix(manifest.InboxPrefix(module)))
	b.t.Cleanup(nc.Close)
	return nc
}

// refusedPub reports whether the bus refused a publish on subject with a permissions
// violation seen by the client.
func refusedPub(t *testing.T, nc *nats.Conn, subject string) bool {
	t.Helper()
	if err := nc.Publish(subject, []byte("probe")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	err := nc.LastError()
	return err != nil && errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `Publish to "`+subject+`"`)
}

// refusedSub reports whether the bus refused a subscription on subject (with queue, if set).
func refusedSub(t *testing.T, nc *nats.Conn, subject, queue string) bool {
	t.Helper()
	var sub *nats.Subscription
	var err error
	if queue != "" {
		sub, err = nc.QueueSubscribeSync(subject, queue)
	} else {
		sub, err = nc.SubscribeSync(subject)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	err = nc.LastError()
	return err != nil && errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `Subscription to "`+subject+`"`)
}

func catalogue(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("../manifest/testdata/catalogue/*.yaml")
	if err != nil || len(files) < 8 {
		t.Fatalf("catalogue: %d files, %v", len(files), err)
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := manifest.Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[m.Module] = string(b)
	}
	return out
}

// TestBed_PermissionsAreTheDerivation registers the whole catalogue and checks, for each
// module, that what the running bus grants is exactly the literal table catalogueGrants —
// written by hand, not computed by the code under test — and that the bus enforces it: a
// probe of every granted subject passes, and a probe of every other module's namespace,
// unused seats, the JetStream API and DEAD is refused.
func TestBed_PermissionsAreTheDerivation(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	cat := catalogue(t)
	type reg struct {
		seed string
		pub  string
	}
	regs := map[string]reg{}
	for _, m := range registrationOrder(cat) {
		seed, r := b.register(cat[m])
		regs[m] = reg{seed: seed, pub: r.PublicKey}
	}

	for module, r := range regs {
		t.Run(module, func(t *testing.T) {
			table, inTable := catalogueGrants[module]
			got, ok := b.n.Bus().Grant(r.pub, "")
			if !inTable {
				if ok {
					t.Fatalf("%s has no grant in the table (it does not require mesh-bus), yet the bus accepts its key", module)
				}
				return
			}
			if !ok {
				t.Fatalf("bus refuses %s's key", module)
			}
			if err := grantDiff(got, table.pub, table.sub, r.pub); err != nil {
				t.Fatal(err)
			}
			want := got

			nc := b.raw(r.seed, module)
			for _, s := range want.Publish.Allow {
				if subj := instance(s); refusedPub(t, nc, subj) {
					t.Errorf("granted publish %s refused (probe %s)", s, subj)
				}
			}
			for _, s := range want.Subscribe.Allow {
				subject, queue, _ := strings.Cut(s, " ")
				if refusedSub(t, nc, subject, queue) {
					t.Errorf("granted subscribe %s refused", s)
				}
			}
			for other := range regs {
				if other == module {
					continue
				}
				for _, subj := range []string{
					manifest.EventSubject(other, "forged.event"), manifest.ToolSubject(other, "status"),
					"$JS.API.CONSUMER.MSG.NEXT.EVENTS." + other, "$JS.ACK.EVENTS." + other + ".1.1.1.1.1",
				} {
					if !refusedPub(t, nc, subj) {
						t.Errorf("publish into %s's namespace (%s) allowed", other, subj)
					}
				}
				if !refusedSub(t, nc, manifest.InboxPrefix(other)+".>", "") {
					t.Errorf("subscribe on %s's inbox allowed", other)
				}
			}
			for _, subj := range []string{
				// The administrators' tools: an independent list, not derived, so an
				// over-grant in the derivation cannot hide here.
				"mesh.seat.mesh-vault.tool.fetch.operator", "mesh.seat.mesh-vault.tool.mint.operator",
				"mesh.seat.mesh-vault.tool.token.operator", "mesh.seat.mesh-vault.tool.identity.node",
				"mesh.seat.mesh-vault.tool.fetch.mod.other", "mesh.seat.mesh-controller.tool.register",
				"mesh.seat.mesh-controller.tool.remove", "mesh.node.alpha.tool.audit",
				"$JS.API.STREAM.LIST", "$JS.API.STREAM.INFO.EVENTS", "$JS.API.CONSUMER.LIST.EVENTS",
				"$JS.API.STREAM.DELETE.EVENTS", "$JS.API.STREAM.PURGE.EVENTS", "$JS.API.STREAM.CREATE.X",
				"$JS.API.CONSUMER.CREATE.EVENTS", "$KV.mesh-registry.module." + module,
				manifest.EventSubject(module, "undeclared.event"), "mesh.state.node.alpha", "mesh.dead.EVENTS.other",
			} {
				if !refusedPub(t, nc, subj) {
					t.Errorf("publish on %s allowed", subj)
				}
			}
		})
	}
}

// TestBed_MeshSeatsAndReservedNames: a module that uses the mesh's own seats may neither
// send them work (a node's) nor call their tools (the operator's), and the administrators'
// names cannot be taken.
func TestBed_MeshSeatsAndReservedNames(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: host\nrequires: [mesh-bus]\nuses: [mesh-controller, mesh-vault]\nsecrets: [k]\n")
	nc := b.raw(seed, "host")
	for _, s := range []string{
		"mesh.seat.mesh-controller.tool.register", "mesh.seat.mesh-controller.tool.list",
		"mesh.seat.mesh-vault.tool.fetch.operator", "mesh.seat.mesh-vault.tool.token.operator",
		"mesh.seat.mesh-vault.tool.identity.node",
	} {
		if !refusedPub(t, nc, s) {
			t.Errorf("a module using a mesh seat published on %s", s)
		}
	}
	if !refusedPub(t, nc, "mesh.admit.host.mesh.seat.mesh-controller.accept.report") {
		t.Error("a module using mesh-controller sent it a host report: only a node may")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"operator", "node", "admin", "vault"} {
		_, err := admin.Register(ctx, b.op, []byte("module: "+name+"\nrequires: [mesh-bus]\nsecrets: [k]\n"))
		if !errors.Is(err, admin.ErrRefused) {
			t.Errorf("module named %s: %v, want refused", name, err)
		}
	}
}

// registrationOrder registers emitters before their consumers would be checked against
// them; the catalogue rules accept any order, so sorted is enough.
func registrationOrder(cat map[string]string) []string {
	var out []string
	for m := range cat {
		out = append(out, m)
	}
	sortStrings(out)
	return out
}

// instance makes a literal subject from a pattern, to probe a publish grant.
func instance(pattern string) string {
	parts := strings.Split(pattern, ".")
	for i, p := range parts {
		switch p {
		case "*":
			parts[i] = "x"
		case ">":
			parts[i] = "x.y"
		}
	}
	return strings.Join(parts, ".")
}

// TestBed_SenderCannotReadTheQueue: a module that uses a seat may submit to it, and is
// refused subscribing on its accept subjects and creating a consumer on its stream.
func TestBed_SenderCannotReadTheQueue(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register(`module: mailer
requires: [mesh-bus]
seats:
  mailer: {scope: mesh, retain: 1h, accepts: [send], serves: [status]}
`)
	seed, _ := b.register(`module: shop
requires: [mesh-bus]
uses: [mailer]
`)
	nc := b.raw(seed, "shop")
	if refusedPub(t, nc, "mesh.admit.shop.mesh.seat.mailer.accept.send") {
		t.Fatal("shop may not submit to the seat it uses")
	}
	for _, s := range []string{"mesh.seat.mailer.accept.send", "mesh.seat.mailer.accept.>", "mesh.seat.mailer.>", "mesh.seat.mailer.tool.status"} {
		if !refusedSub(t, nc, s, "") {
			t.Errorf("shop subscribed on %s", s)
		}
	}
	for _, s := range []string{"$JS.API.CONSUMER.CREATE.SEAT_mailer", "$JS.API.CONSUMER.CREATE.SEAT_mailer.spy.mesh.seat.mailer.accept.send",
		"$JS.API.CONSUMER.DURABLE.CREATE.SEAT_mailer.spy", "$JS.API.CONSUMER.MSG.NEXT.SEAT_mailer.seat-mailer"} {
		if !refusedPub(t, nc, s) {
			t.Errorf("shop published on %s", s)
		}
	}
	// Through the JetStream client the refusal is a permissions violation, not just a timeout.
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := js.CreateConsumer(ctx, "SEAT_mailer", jetstream.ConsumerConfig{Durable: "spy"}); err == nil {
		t.Fatal("shop created a consumer on SEAT_mailer")
	}
	if err := nc.LastError(); err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("consumer create refused without a permissions violation: %v", err)
	}

	// The sdk's Submit lands in the seat's queue.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := b.client(seed)
	if _, err := c.Submit(ctx, "mailer", "send", map[string]string{"to": "a@b"}); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if _, err := c.Submit(ctx, "mailer", "fax", nil); !errors.Is(err, sdk.ErrNotDeclared) {
		t.Fatalf("Submit of an undeclared verb: %v, want ErrNotDeclared", err)
	}
	s, err := b.js.Stream(ctx, "SEAT_mailer")
	if err != nil {
		t.Fatal(err)
	}
	// The probe publish above and the Submit: the sender writes, and only writes.
	if n := s.CachedInfo().State.Msgs; n != 2 {
		t.Fatalf("SEAT_mailer holds %d jobs, want 2", n)
	}
}

// TestBed_Refusals: a module cannot publish into another's namespace, emit what it did not
// declare, delete or purge a stream, or read another module's inbox; the sdk says so.
func TestBed_Refusals(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	b.register("module: other\nrequires: [mesh-bus]\nemits: [order.placed]\ntools: [status]\n")
	nc := b.raw(seedA, "a")
	for _, s := range []string{
		"mesh.mod.other.event.order.placed", "mesh.mod.other.tool.status", "mesh.mod.a.event.order.cancelled",
		// Events go through the admitter, under the module's own prefix: not another's, not
		// another's events under its own, not what it does not declare, not straight to EVENTS.
		"mesh.admit.other.mesh.mod.other.event.order.placed", "mesh.admit.a.mesh.mod.other.event.order.placed",
		"mesh.admit.a.mesh.mod.a.event.order.cancelled", "mesh.mod.a.event.order.placed",
		"$JS.API.STREAM.DELETE.EVENTS", "$JS.API.STREAM.PURGE.EVENTS", "$JS.API.STREAM.DELETE.KV_mesh-registry",
	} {
		if !refusedPub(t, nc, s) {
			t.Errorf("a published on %s", s)
		}
	}
	if !refusedSub(t, nc, "_INBOX.other.>", "") {
		t.Error("a subscribed on other's inbox")
	}
	// The JetStream client surfaces the refusal as a permissions violation.
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, "EVENTS"); err == nil {
		t.Fatal("a deleted EVENTS")
	}
	if err := nc.LastError(); !strings.Contains(err.Error(), "$JS.API.STREAM.DELETE.EVENTS") {
		t.Fatalf("delete refused without naming the subject: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.js.Stream(ctx, "EVENTS"); err != nil {
		t.Fatalf("EVENTS is gone: %v", err)
	}

	c := b.client(seedA)
	if _, err := c.Emit(ctx, "order.cancelled", nil); !errors.Is(err, sdk.ErrNotDeclared) || !strings.Contains(err.Error(), "emits:") {
		t.Fatalf("Emit undeclared: %v, want ErrNotDeclared saying what to declare", err)
	}
	if _, err := c.Call(ctx, "other", "status", nil); !errors.Is(err, sdk.ErrNotDeclared) {
		t.Fatalf("Call of another module's tool: %v, want ErrNotDeclared", err)
	}
	if err := c.On("other.order.placed", func(context.Context, sdk.Event) error { return nil }); !errors.Is(err, sdk.ErrNotDeclared) {
		t.Fatalf("On undeclared: %v, want ErrNotDeclared", err)
	}

	// A key the bus does not know is refused at connect, with what to do.
	unknown := filepath.Join(t.TempDir(), "x.nk")
	os.WriteFile(unknown, []byte("SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU\n"), 0o600)
	if _, err := sdk.Connect(ctx, b.n.ClientURL(), unknown); !errors.Is(err, sdk.ErrUnknownKey) || !strings.Contains(err.Error(), "meshnode module register") {
		t.Fatalf("Connect with an unknown key: %v", err)
	}
}

// collector gathers delivered events.
type collector struct {
	only   string // keep only events of this key, when set
	mu     sync.Mutex
	events []sdk.Event
}

func (c *collector) handle(_ context.Context, e sdk.Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.only == "" || e.Key == c.only {
		c.events = append(c.events, e)
	}
	return nil
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.events)
}

func (c *collector) all() []sdk.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]sdk.Event(nil), c.events...)
}

// TestBed_EmitReachesEveryConsumer: an event reaches every consuming module's handler with
// the envelope; an unknown x- header is delivered; a duplicate x-event-id is stored once.
func TestBed_EmitReachesEveryConsumer(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, regA := b.register("module: a\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.order.placed]\n")
	seedC, _ := b.register("module: c\nrequires: [mesh-bus]\nconsumes: [\"**\"]\n")

	var gotB collector
	gotC := collector{only: "a.order.placed"} // ** also sees the mesh's own events
	cb, cc := b.client(seedB), b.client(seedC)
	if err := cb.On("a.order.placed", gotB.handle); err != nil {
		t.Fatal(err)
	}
	if err := cc.On("**", gotC.handle); err != nil {
		t.Fatal(err)
	}
	ca := b.client(seedA)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := ca.Emit(ctx, "order.placed", map[string]int{"order": 7}, sdk.CausedBy("cause-1"), sdk.WithSchema("order/v1"))
	if err != nil {
		t.Fatal(err)
	}

	// A plain client with a's key: an unknown x- header travels, and a duplicate
	// Nats-Msg-Id inside the window is stored once.
	nc := b.raw(seedA, "a")
	js, _ := jetstream.New(nc)
	subject := manifest.EventSubject("a", "order.placed")
	h, _ := envelope.Stamp(mustKey(t, seedA), "a", "alpha", subject, []byte(`{"order":8}`), envelope.Options{})
	h.Set("x-foo", "bar")
	for range 2 {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("a", subject), Header: h, Data: []byte(`{"order":8}`)}); err != nil {
			t.Fatal(err)
		}
	}

	retryUntil(t, 10*time.Second, func() error {
		if gotB.count() < 2 || gotC.count() < 2 {
			return errors.New("events not yet delivered")
		}
		return nil
	})
	if n := eventsOn(t, b, subject); n != 2 {
		t.Fatalf("EVENTS holds %d messages on %s, want 2 (the duplicate stored once)", n, subject)
	}
	for name, col := range map[string]*collector{"b": &gotB, "c": &gotC} {
		evs := col.all()
		if len(evs) != 2 {
			t.Fatalf("%s got %d events, want 2", name, len(evs))
		}
		e := evs[0]
		if e.ID != id || e.Key != "a.order.placed" || e.Source != "a" || e.Node != "alpha" || e.Causation != "cause-1" || e.Schema != "order/v1" ||
			e.Header.Get(envelope.ContentType) != envelope.JSON || string(e.Data) != `{"order":7}` {
			t.Errorf("%s got %+v", name, e)
		}
		if err := envelope.Verify(e.Header, e.Subject, e.Data, regA.PublicKey); err != nil {
			t.Errorf("%s: signature: %v", name, err)
		}
		if evs[1].Header.Get("x-foo") != "bar" {
			t.Errorf("%s: unknown header x-foo not delivered: %v", name, evs[1].Header)
		}
	}
}

// TestBed_DurableWhileAway: a consumer that is offline while events arrive gets them when it
// comes back.
func TestBed_DurableWhileAway(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [tick]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.tick]\n")
	ca := b.client(seedA)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 20 {
		if _, err := ca.Emit(ctx, "tick", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	var got collector
	cb := b.client(seedB)
	if err := cb.On("a.tick", got.handle); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if n := got.count(); n != 20 {
			return errors.New("have " + itoa(n) + " of 20")
		}
		return nil
	})
}

// TestBed_PoisonGoesToDead: a handler that always fails sees MaxDeliver attempts, then the
// event is in DEAD with the reason and the original headers.
func TestBed_PoisonGoesToDead(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [bad]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.bad]\n")
	var mu sync.Mutex
	attempts := 0
	cb := b.client(seedB, sdk.WithRetryBackoff(10*time.Millisecond))
	if err := cb.On("a.bad", func(context.Context, sdk.Event) error {
		mu.Lock()
		attempts++
		mu.Unlock()
		return errors.New("cannot parse order")
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, err := b.client(seedA).Emit(ctx, "bad", map[string]string{"x": "y"})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := b.js.Stream(ctx, manifest.DeadStreamName)
	if err != nil {
		t.Fatal(err)
	}
	var msg *jetstream.RawStreamMsg
	retryUntil(t, 15*time.Second, func() error {
		m, err := dead.GetLastMsgForSubject(ctx, manifest.DeadSubject(manifest.EventsStreamName, "b"))
		msg = m
		return err
	})
	if got := msg.Header.Get(envelope.DeadReason); got != "cannot parse order" {
		t.Errorf("x-dead-reason=%q", got)
	}
	if got := msg.Header.Get(envelope.DeadDeliveries); got != itoa(manifest.MaxDeliver) {
		t.Errorf("x-dead-deliveries=%q, want %d", got, manifest.MaxDeliver)
	}
	if msg.Header.Get(envelope.EventID) != id || msg.Header.Get(envelope.Source) != "a" || msg.Header.Get(envelope.Signature) == "" {
		t.Errorf("original headers not kept: %v", msg.Header)
	}
	if got := msg.Header.Get(envelope.DeadSubject); got != manifest.EventSubject("a", "bad") {
		t.Errorf("x-dead-subject=%q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if attempts != manifest.MaxDeliver {
		t.Errorf("handler ran %d times, want %d", attempts, manifest.MaxDeliver)
	}
	// Acked after dead-lettering: nothing is pending on b's consumer.
	retryUntil(t, 5*time.Second, func() error {
		cons, err := b.js.Consumer(ctx, manifest.EventsStreamName, "b")
		if err != nil {
			return err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumAckPending != 0 || info.NumPending != 0 {
			return errors.New("b's consumer still has the poison pending")
		}
		return nil
	})
}

// TestBed_ToolsAndReRegistration: a module serves a tool the operator calls; re-registering
// it with a new tool kicks its connection, which comes back able to serve the new tool.
func TestBed_ToolsAndReRegistration(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: a\nrequires: [mesh-bus]\ntools: [status]\n")
	c := b.client(seed)
	if err := c.Serve("status", func(_ context.Context, r sdk.Request) ([]byte, error) {
		return append([]byte("ok:"), r.Data...), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Serve("health", nil); !errors.Is(err, sdk.ErrNotDeclared) {
		t.Fatalf("Serve undeclared: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply, err := b.op.RequestWithContext(ctx, manifest.ToolSubject("a", "status"), []byte("ping"))
	if err != nil {
		t.Fatalf("call status: %v", err)
	}
	if string(reply.Data) != "ok:ping" {
		t.Fatalf("call status answered %q", reply.Data)
	}

	_, r := b.register("module: a\nrequires: [mesh-bus]\ntools: [status, health]\n")
	if r.Created {
		t.Fatal("re-registration minted a new key")
	}
	retryUntil(t, 10*time.Second, func() error {
		return c.Serve("health", func(context.Context, sdk.Request) ([]byte, error) { return []byte("fine"), nil })
	})
	retryUntil(t, 10*time.Second, func() error {
		reply, err := b.op.RequestWithContext(ctx, manifest.ToolSubject("a", "health"), nil)
		if err != nil {
			return err
		}
		if string(reply.Data) != "fine" {
			return errors.New(string(reply.Data))
		}
		return nil
	})
}

func mustKey(t *testing.T, seedFile string) nkeys.KeyPair {
	t.Helper()
	b, err := os.ReadFile(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func itoa(n int) string { return strconv.Itoa(n) }

func sortStrings(s []string) { slices.Sort(s) }

// TestBed_ReRegisterAndRemove: re-registration updates the module's consumer filters in place;
// removal deletes its consumer, refuses its key, and keeps a seat's queued work.
func TestBed_ReRegisterAndRemove(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	seed, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.x]\nseats:\n  work: {scope: mesh, retain: 1h, accepts: [do]}\n")
	b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.x, a.y]\nseats:\n  work: {scope: mesh, retain: 1h, accepts: [do]}\n")
	cons, err := b.js.Consumer(ctx, manifest.EventsStreamName, "b")
	if err != nil {
		t.Fatal(err)
	}
	if got := cons.CachedInfo().Config.FilterSubjects; !slices.Equal(got, []string{"mesh.mod.a.event.x", "mesh.mod.a.event.y", manifest.ReplayFilter("b")}) {
		t.Fatalf("filters after re-registration: %v", got)
	}
	// A job waits in the seat's queue.
	if _, err := b.js.Publish(ctx, "mesh.seat.work.accept.do", []byte("{}")); err != nil {
		t.Fatal(err)
	}

	// A client of the module: refused from the removal on, it gives up after its patience
	// (a node's restart refuses it too, for a while, and it rides that out).
	patient := b.client(seed, sdk.WithAuthPatience(300*time.Millisecond))

	reply, err := admin.Remove(ctx, b.op, api.RemoveRequest{Module: "b"})
	if err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if !patient.Conn().IsClosed() {
			return fmt.Errorf("the removed module's client is still %v", patient.Conn().Status())
		}
		return nil
	})
	if len(reply.Kept) != 1 || !strings.Contains(reply.Kept[0], "SEAT_work keeps 1") {
		t.Fatalf("kept=%v, want SEAT_work kept for its job", reply.Kept)
	}
	if _, err := b.js.Consumer(ctx, manifest.EventsStreamName, "b"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("b's consumer after removal: %v", err)
	}
	if _, err := b.js.Stream(ctx, "SEAT_work"); err != nil {
		t.Fatalf("SEAT_work with a queued job was deleted: %v", err)
	}
	if _, err := sdk.Connect(ctx, b.n.ClientURL(), seed); !errors.Is(err, sdk.ErrUnknownKey) {
		t.Fatalf("removed module connected: %v", err)
	}
	if _, err := admin.Remove(ctx, b.op, api.RemoveRequest{Module: "b"}); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "module ls") {
		t.Fatalf("removing twice: %v", err)
	}
	// The seat's work is still there for the next module that declares it.
	b.register("module: b2\nrequires: [mesh-bus]\nseats:\n  work: {scope: mesh, retain: 1h, accepts: [do]}\n")
	s, _ := b.js.Stream(ctx, "SEAT_work")
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("SEAT_work holds %d jobs after a new declarer registered, want 1", n)
	}
}

// TestBed_RefusedRegistration: a refused manifest changes nothing and the reply lists every
// reason.
func TestBed_RefusedRegistration(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: mailer\nrequires: [mesh-bus]\nseats:\n  mailer: {scope: mesh, retain: 1h, accepts: [send]}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := admin.Register(ctx, b.op, []byte("module: other\nrequires: [mesh-bus]\nemits: [mesh.mod.x.event.y]\nseats:\n  mesh-x: {scope: mesh, retain: 1h, accepts: [send]}\n"))
	var rs manifest.Refusals
	if !errors.Is(err, admin.ErrRefused) || !errors.As(err, &rs) || len(rs) < 2 {
		t.Fatalf("err=%v, want ErrRefused with at least two refusals", err)
	}
	_, err = admin.Register(ctx, b.op, []byte("module: other\nrequires: [mesh-bus]\nseats:\n  mailer: {scope: mesh, retain: 1h, accepts: [send]}\n"))
	if !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "mailer") {
		t.Errorf("a second declarer of seat mailer: %v, want a refusal naming mailer", err)
	}
	mods, err := admin.List(ctx, b.op)
	if err != nil || len(mods) != 1 {
		t.Fatalf("after a refusal the registry holds %d modules (%v)", len(mods), err)
	}
}

// TestStatus_StandaloneMode: a single node's status says standalone, from the server, with no
// meta group (the clustered case is asserted in TestIntegration_Cluster_FoundingThree).
func TestStatus_StandaloneMode(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	js := b.n.Status(context.Background()).JetStream
	if js.Mode != "standalone" || js.MetaLeader != "" || len(js.Peers) != 0 {
		t.Fatalf("jetstream status %+v", js)
	}
}

// eachMessage hands f every message stored in stream (on subject, when not empty), oldest
// first, as they are when it starts.
func (b *bed) eachMessage(t testing.TB, stream, subject string, f func(jetstream.Msg)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cfg jetstream.OrderedConsumerConfig
	if subject != "" {
		cfg.FilterSubjects = []string{subject}
	}
	c, err := b.js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for {
		batch, err := c.FetchNoWait(500)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			f(m)
		}
		if got == 0 {
			return
		}
	}
}
