package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/seats"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// The adversarial beds of issue 11: every attack that broke the node's authority through its
// own connections, as a test. Each one attacks a real node the way a registered module (or a
// join token's bearer) could, then checks that nothing reached the target.

// injectionTargets are subjects a requester once made the node write to by naming them as a
// request's reply subject: the vault's and the registry's buckets, the controller's lease,
// a node's declaration, a seat's queue and another module's namespace.
var injectionTargets = []string{
	"$KV.mesh-vault.secret.operator.stolen",
	"$KV.mesh-seats.mesh-controller",
	"$KV.mesh-registry.module.victim",
	"$KV.mesh-registry.identity.vault",
	"$KV.mesh-registry.identity.operator",
	"mesh.state.node.alpha",
	"mesh.seat.mailer.accept.send",
	manifest.EventSubject("victim", "order.placed"),
	"_INBOX.victim.stolen",
	"$JS.API.STREAM.DELETE.EVENTS",
}

// spy counts what arrives on each target, seen by the operator (who may hear anything).
type spy struct {
	mu   sync.Mutex
	seen map[string]int
	nc   *nats.Conn
}

func newSpy(t *testing.T, b *bed, subjects []string) *spy {
	t.Helper()
	// A registration writes its module's record twice: with the change's event, then without
	// it once EVENTS has it (the outbox). The second write is no attack: wait it out.
	for _, subj := range subjects {
		if key, ok := strings.CutPrefix(subj, "$KV."+registry.Bucket+"."); ok {
			registrySettled(t, b, key)
		}
	}
	s := &spy{seen: map[string]int{}, nc: b.operatorConn()}
	t.Cleanup(s.nc.Close)
	for _, subj := range subjects {
		if _, err := s.nc.Subscribe(subj, func(m *nats.Msg) {
			if renewal(m) {
				return
			}
			s.mu.Lock()
			s.seen[m.Subject]++
			s.mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// registrySettled waits until the registry's record key, if there is one, holds no event
// still to publish.
func registrySettled(t *testing.T, b *bed, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := b.js.KeyValue(ctx, registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		var rec struct {
			Outbox []json.RawMessage `json:"outbox"`
		}
		if json.Unmarshal(e.Value(), &rec) == nil && len(rec.Outbox) > 0 {
			return fmt.Errorf("registry record %s still holds %d events to publish", key, len(rec.Outbox))
		}
		return nil
	})
}

// renewal reports whether m is the node renewing its own lease of a seat (once a second for
// mesh-controller, whatever the test does): a lease record of this seat held by the node,
// which no answer to a request could pass for.
func renewal(m *nats.Msg) bool {
	key, ok := strings.CutPrefix(m.Subject, "$KV."+seats.Bucket+".")
	if !ok {
		return false
	}
	var l seats.Lease
	if err := json.Unmarshal(m.Data, &l); err != nil {
		return false
	}
	return l.Seat == key && l.Module == "" && l.Node == "alpha" && l.Instance == "alpha"
}

// none fails the test for every target something reached.
func (s *spy) none(t *testing.T, attack string) {
	t.Helper()
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for subj, n := range s.seen {
		t.Errorf("%s: the node wrote %d message(s) to %s", attack, n, subj)
	}
}

// sendThenAsk publishes an attack request on subject with the given reply subject, then the
// same request with a legitimate reply on the same connection, and waits for that answer:
// a responder handles one subscription's requests in order, so once the legitimate answer is
// in, the attack has been handled too.
func sendThenAsk(t *testing.T, nc *nats.Conn, subject string, replies []string, body []byte) *nats.Msg {
	t.Helper()
	for _, r := range replies {
		if err := nc.PublishRequest(subject, r, body); err != nil {
			t.Fatal(err)
		}
	}
	m, err := nc.Request(subject, body, 5*time.Second)
	if err != nil {
		t.Fatalf("the legitimate request after the attack on %s: %v", subject, err)
	}
	return m
}

func TestAttack_ReplySubjectInjection(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: victim\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	b.register(catalogue(t)["mailer"])
	seed, reg := b.register("module: attacker\nrequires: [mesh-bus]\nsecrets: [token]\nuses: [mailer]\nseats:\n  own:\n    scope: node\n    retain: 1d\n    accepts: [work]\n")
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "attacker", Name: "token"}, nil); err != nil {
		t.Fatal(err)
	}
	s := newSpy(t, b, injectionTargets)

	t.Run("whoami", func(t *testing.T) {
		nc := b.raw(seed, "attacker")
		body, _ := json.Marshal(api.WhoamiRequest{PublicKey: reg.PublicKey})
		m := sendThenAsk(t, nc, api.WhoamiSubject(reg.PublicKey), injectionTargets, body)
		var who api.WhoamiReply
		if err := json.Unmarshal(m.Data, &who); err != nil || who.Module != "attacker" {
			t.Fatalf("whoami on the module's own inbox: %s, %v", m.Data, err)
		}
		s.none(t, "whoami")
	})
	t.Run("vault fetch", func(t *testing.T) {
		nc := b.raw(seed, "attacker")
		xkp, _ := nkeys.CreateCurveKeys()
		xpub, _ := xkp.PublicKey()
		body, _ := json.Marshal(api.VaultRequest{XKey: xpub, Name: "token"})
		m := sendThenAsk(t, nc, api.VaultToolSubject(api.VaultVerbFetch, api.VaultModuleCaller("attacker")), injectionTargets, body)
		var r api.VaultReply
		if err := json.Unmarshal(m.Data, &r); err != nil || r.Error != "" || len(r.Sealed) == 0 {
			t.Fatalf("a fetch on the module's own inbox: %s, %v", m.Data, err)
		}
		s.none(t, "vault fetch")
	})
	t.Run("seat tool", func(t *testing.T) {
		nc := b.raw(seed, "attacker")
		body, _ := json.Marshal(api.SeatRequest{Action: "nothing", Seat: "own", Instance: "x"})
		sendThenAsk(t, nc, node.SeatToolSubject("alpha", "attacker"), injectionTargets, body)
		s.none(t, "seat tool")
	})
	// After all of it the node still works: its vault answers, its controller holds.
	if _, err := b.vault(api.VaultVerbList, api.VaultRequest{Owner: "attacker"}, nil); err != nil {
		t.Fatalf("vault after the attacks: %v", err)
	}
}

// TestAttack_WhoamiAboutAnotherKey: whoami answers a connection about its own key only.
func TestAttack_WhoamiAboutAnotherKey(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	_, victim := b.register("module: victim\nrequires: [mesh-bus]\nsecrets: [db-password]\n")
	seed, attacker := b.register("module: attacker\nrequires: [mesh-bus]\n")
	nc := b.raw(seed, "attacker")
	body, _ := json.Marshal(api.WhoamiRequest{PublicKey: victim.PublicKey})
	for _, subject := range []string{api.WhoamiSubject(victim.PublicKey), api.WhoamiSubject(attacker.PublicKey)} {
		if m, err := nc.Request(subject, body, 500*time.Millisecond); err == nil {
			t.Fatalf("whoami about another module's key, on %s, answered: %s", subject, m.Data)
		}
	}
}

// TestAttack_SpentToken: a join token that has done its one thing, or expired, no longer
// opens a connection; a live token's enrol answers only on the token's own inbox.
func TestAttack_SpentToken(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mint := func(ttl string) *api.Token {
		var tok api.Token
		if _, err := b.vault(api.VaultVerbToken, api.VaultRequest{TTL: ttl}, &tok); err != nil {
			t.Fatal(err)
		}
		return &tok
	}
	connectToken := func(tok *api.Token) (*nats.Conn, string, error) {
		bearer, err := vault.ParseToken(tok.Token)
		if err != nil {
			t.Fatal(err)
		}
		kp, _ := nkeys.FromSeed([]byte(bearer.Seed))
		pub, _ := kp.PublicKey()
		nc, err := nats.Connect(b.n.ClientURL(), nats.Nkey(pub, kp.Sign), nats.MaxReconnects(0),
			nats.CustomInboxPrefix(api.BootstrapInbox(pub)))
		return nc, pub, err
	}

	live := mint("1h")
	s := newSpy(t, b, injectionTargets)
	nc, _, err := connectToken(live)
	if err != nil {
		t.Fatalf("a live token is refused at connect: %v", err)
	}
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	body, _ := json.Marshal(api.VaultRequest{XKey: xpub, Node: "", MeshID: b.n.Identity().MeshID})
	// enrol naming no node is refused, and spends nothing: the token stays live.
	sendThenAsk(t, nc, api.VaultToolSubject(api.VaultVerbEnrol, live.ID), injectionTargets, body)
	nc.Close()
	s.none(t, "enrol")

	if _, err := vault.Enrol(context.Background(), live.Token, "beta", xkp); err != nil {
		t.Fatalf("enrol: %v", err)
	}
	if nc, _, err := connectToken(live); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("a spent token connects: %v", err)
	}
	if _, err := vault.Enrol(context.Background(), live.Token, "gamma", xkp); err == nil || !strings.Contains(err.Error(), "used up") {
		t.Fatalf("second use: %v, want refused as used up", err)
	}

	short := mint("1ms")
	retryUntil(t, 5*time.Second, func() error {
		nc, _, err := connectToken(short)
		if nc != nil {
			nc.Close()
		}
		if !errors.Is(err, nats.ErrAuthorization) {
			return fmt.Errorf("an expired token connects: %v", err)
		}
		return nil
	})
}

// TestAttack_VaultRepliesToTheCallersInbox: a module's vault request naming another module's
// inbox as its reply is not answered there.
func TestAttack_VaultRepliesToTheCallersInbox(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: victim\nrequires: [mesh-bus]\n")
	seed, _ := b.register("module: attacker\nrequires: [mesh-bus]\nsecrets: [token]\n")
	victimInbox := manifest.InboxPrefix("victim") + ".x"
	s := newSpy(t, b, []string{victimInbox})
	nc := b.raw(seed, "attacker")
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	body, _ := json.Marshal(api.VaultRequest{XKey: xpub, Name: "token"})
	sendThenAsk(t, nc, api.VaultToolSubject(api.VaultVerbFetch, api.VaultModuleCaller("attacker")), []string{victimInbox}, body)
	s.none(t, "vault fetch into another module's inbox")
}

// TestAttack_ToolReplyInjection: a module answering its tools replies only into the inbox
// space; a caller naming a bucket or another namespace as the reply subject gets nothing
// written there (nats-server's response permission would have allowed it).
func TestAttack_ToolReplyInjection(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: victim\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	seed, _ := b.register("module: served\nrequires: [mesh-bus]\ntools: [status]\n")
	nc := b.raw(seed, "served")
	if _, err := nc.QueueSubscribe(manifest.ToolSubject("served", "status"), "served", func(m *nats.Msg) {
		m.Respond([]byte(`{"ok":true}`))
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// A module's own tools are the operator's to call: it answers into the operator's inbox
	// and nowhere else, not even another module's inbox.
	targets := injectionTargets
	s := newSpy(t, b, targets)
	op := b.operatorConn()
	defer op.Close()
	sendThenAsk(t, op, manifest.ToolSubject("served", "status"), targets, []byte("{}"))
	// The handler's connection handles requests in order: its answer to the legitimate call
	// came after every refused reply; one more round trip on it lets the server's verdicts in.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s.none(t, "tool reply")
}

// TestAttack_AuthorityChangeKicks: a re-registration that adds secrets or seats changes the
// module's grant, so its connections are kicked and come back under the new one.
func TestAttack_AuthorityChangeKicks(t *testing.T) {
	t.Parallel() // mostly waits (redeliveries, a follower's back-off): it overlaps the others
	b := newBed(t)
	seed, _ := b.register("module: grows\nrequires: [mesh-bus]\n")
	for i, text := range []string{
		"module: grows\nrequires: [mesh-bus]\nsecrets: [api-key]\n",
		"module: grows\nrequires: [mesh-bus]\nsecrets: [api-key]\nseats:\n  grown:\n    scope: mesh\n    serves: [status]\n",
	} {
		nc := b.raw(seed, "grows")
		reconnected := make(chan struct{}, 1)
		nc.SetReconnectHandler(func(*nats.Conn) {
			select {
			case reconnected <- struct{}{}:
			default:
			}
		})
		b.register(text)
		select {
		case <-reconnected:
		case <-time.After(10 * time.Second):
			t.Fatalf("re-registration %d changed the grant and kicked no connection", i+1)
		}
	}
}

// TestGrant_SubjectsAgree: the grant names the same subjects the vault and the controller
// serve; a rename on one side would lock modules out.
func TestGrant_SubjectsAgree(t *testing.T) {
	t.Parallel()
	if got, want := manifest.VaultFetchSubject("billing"), api.VaultToolSubject(api.VaultVerbFetch, api.VaultModuleCaller("billing")); got != want {
		t.Errorf("VaultFetchSubject = %s, the vault serves %s", got, want)
	}
	if got, want := manifest.WhoamiSubject("UABC"), api.WhoamiSubject("UABC"); got != want {
		t.Errorf("WhoamiSubject = %s, the controller serves %s", got, want)
	}
	if got, want := manifest.BootstrapInbox("UABC"), api.BootstrapInbox("UABC"); got != want {
		t.Errorf("BootstrapInbox = %s, want %s", got, want)
	}
}

// TestAttack_VaultConnectionIsItsOwn: the vault's own connection writes its bucket and its
// events, and nothing else: not the registry, not the leases, not a module's namespace.
func TestAttack_VaultConnectionIsItsOwn(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := b.js.KeyValue(ctx, registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "identity.vault")
	if err != nil {
		t.Fatal(err)
	}
	pub := strings.Trim(string(e.Value()), "\" \n")
	if strings.HasPrefix(pub, "{") {
		var v struct {
			PublicKey string `json:"public_key"`
		}
		json.Unmarshal(e.Value(), &v)
		pub = v.PublicKey
	}
	grant, ok := b.n.Bus().Grant(pub, "vault")
	if !ok || grant == nil || grant.Publish == nil {
		t.Fatalf("the vault's key %q has grant %+v, %v; want a bounded one", pub, grant, ok)
	}
	for _, subj := range grant.Publish.Allow {
		if subj == ">" || strings.HasPrefix(subj, "$KV.mesh-registry") || strings.HasPrefix(subj, "$KV.mesh-seats") ||
			strings.HasPrefix(subj, "mesh.mod.") || strings.HasPrefix(subj, "$JS.API.STREAM.DELETE") {
			t.Errorf("the vault's connection may publish on %s", subj)
		}
	}
}

// TestAttack_SeatToolRepliesGoToCallers: a seat's holder answers its tools into the inboxes
// of the modules that use the seat (and the operator's), and nowhere else; a module that
// starts using the seat later is answered too (the holder's grant follows the catalogue).
func TestAttack_SeatToolRepliesGoToCallers(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: victim\nrequires: [mesh-bus]\n")
	serverSeed, _ := b.register("module: server\nrequires: [mesh-bus]\nseats:\n  desk: {scope: mesh, retain: 1h, accepts: [work], serves: [status]}\n")
	userSeed, _ := b.register("module: user\nrequires: [mesh-bus]\nuses: [desk]\n")
	hc := b.client(serverSeed)
	if err := hc.HoldSeat("desk", sdk.SeatHandlers{
		Accepts: map[string]sdk.JobHandler{"work": func(context.Context, sdk.Job) error { return nil }},
		Serves:  map[string]sdk.ToolHandler{"status": func(context.Context, sdk.Request) ([]byte, error) { return []byte(`{"ok":true}`), nil }},
	}); err != nil {
		t.Fatal(err)
	}
	holder(t, "desk", hc)

	call := func(seed string) error {
		c := b.client(seed)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := c.Call(ctx, "desk", "status", map[string]any{})
		return err
	}
	retryUntil(t, 15*time.Second, func() error { return call(userSeed) })

	// A user naming another module's inbox as the reply: the holder's answer is refused.
	s := newSpy(t, b, []string{"_INBOX.victim.stolen"})
	nc := b.raw(userSeed, "user")
	sendThenAsk(t, nc, manifest.SeatToolSubject("desk", "status"), []string{"_INBOX.victim.stolen"}, []byte("{}"))
	if err := hc.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	s.none(t, "seat tool reply")

	// A module that uses the seat from now on is answered: the holder was kicked, reclaimed
	// the seat and holds a grant that names the newcomer's inbox.
	lateSeed, _ := b.register("module: late\nrequires: [mesh-bus]\nuses: [desk]\n")
	retryUntil(t, 20*time.Second, func() error { return call(lateSeed) })
}

// TestAttack_ToolAnswerRefusalIsExplained: a caller without the operator's inbox prefix
// (the plain NATS CLI's default) gets no answer from a module's tool; the module's log says
// why and what the caller must do.
func TestAttack_ToolAnswerRefusalIsExplained(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: served\nrequires: [mesh-bus]\ntools: [status]\n")
	var log testbed.SyncBuffer
	c := b.client(seed, sdk.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err := c.Serve("status", func(context.Context, sdk.Request) ([]byte, error) { return []byte("{}"), nil }); err != nil {
		t.Fatal(err)
	}
	plain := connect(t, b.n.ClientURL(), filepath.Join(b.dir, datadir.OperatorSeedFile)) // inbox _INBOX.<nuid>
	defer plain.Close()
	if _, err := plain.Request(manifest.ToolSubject("served", "status"), []byte("{}"), 500*time.Millisecond); err == nil {
		t.Fatal("a module answered into an inbox outside the operator's")
	}
	retryUntil(t, 10*time.Second, func() error {
		if !strings.Contains(log.String(), "--inbox-prefix "+manifest.OperatorInbox) {
			return fmt.Errorf("the module's log does not say what the caller must do: %q", log.String())
		}
		return nil
	})
	op := b.operatorConn()
	defer op.Close()
	if _, err := op.Request(manifest.ToolSubject("served", "status"), []byte("{}"), 5*time.Second); err != nil {
		t.Fatalf("the operator's inbox: %v", err)
	}
}

// TestAttack_NodeConnectionIsBounded: the node's own connection — the registry, the leases,
// the audit log, the controller — is refused by the server wherever a defect could send it
// and its work never goes: the vault's bucket, a module's events, tools and inbox, dead
// letters, replies into anyone's inbox. What it must do still passes (the positive control,
// and every other bed of this package, which runs on it).
func TestAttack_NodeConnectionIsBounded(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: victim\nrequires: [mesh-bus]\nemits: [order.placed]\ntools: [status]\n")
	refused := []string{
		"$KV.mesh-vault.secret.operator.stolen",
		"$KV.mesh-vault.meta.mesh",
		manifest.EventSubject("victim", "order.placed"),
		manifest.ToolSubject("victim", "status"),
		"_INBOX.victim.stolen",
		"_INBOX.operator.stolen",
		manifest.DeadSubject("EVENTS", "victim"),
		"$KV.mesh-kv-victim.key",                             // a module's own bucket
		manifest.NodeToolSubject("beta", "remove"),           // another node's tools
		manifest.NodeSeatToolSubject("alpha", "victim"),      // a module's seat tool, in its name
		api.VaultToolSubject(api.VaultVerbFetch, "operator"), // the vault as someone else
		manifest.SeatToolSubject("desk", "status"),           // a module's seat's tools
		manifest.SeatEventSubject("desk", "done"),            // a module's seat's events
		"$JS.API.STREAM.PURGE.KV_mesh-vault",
		"$JS.API.STREAM.MSG.DELETE.KV_mesh-vault",
	}
	control := manifest.SeatToolSubject(manifest.ControllerSeat, "probe-control")
	s := newSpy(t, b, append(slices.Clone(refused), control))
	nc := b.n.Bus().Conn()
	for _, subj := range refused {
		if err := nc.Publish(subj, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	// The server handles a connection's messages in order: once the control has arrived,
	// every publish above has been decided.
	if err := nc.Publish(control, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.seen[control] == 0 {
			return errors.New("the control has not arrived")
		}
		delete(s.seen, control)
		return nil
	})
	s.none(t, "the node's own connection")

	grant, ok := b.n.Bus().Grant(b.n.Identity().PublicKey, "")
	if !ok || grant == nil || grant.Publish == nil || len(grant.Publish.Allow) == 0 {
		t.Fatalf("the node's key has grant %+v, %v; want a bounded one", grant, ok)
	}
	for _, subj := range grant.Publish.Allow {
		if subj == ">" || subj == "$KV.>" || strings.HasPrefix(subj, "_INBOX") || strings.HasPrefix(subj, "mesh.mod.") ||
			strings.HasPrefix(subj, "mesh.dead") || strings.HasPrefix(subj, "mesh.node.*.tool") {
			t.Errorf("the node's own connection may publish on %s", subj)
		}
	}
}
