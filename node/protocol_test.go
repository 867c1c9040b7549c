package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// reportCount reads the node's count of modules' report jobs with outcome from /metrics.
func reportCount(t *testing.T, b *bed, outcome string) int {
	t.Helper()
	return int(counter(scrape(t, b.n.HTTPURL()), "meshnode_controller_reports_total", "from", "module", "outcome", outcome))
}

// TestProtocol_OnlyANodeReports: host reports are a node's apply outcomes and build jobs
// the controller's, so `uses: [mesh-controller]` or `uses: [mesh-build-machine]` lets a
// module publish neither (the bus refuses them before anything is stored); only a builder
// module — the one declaring mesh-build-machine — may queue that seat's work. A module's
// report that reaches the work queue anyway (here the operator's connection stands in for a
// grant that let it through) is refused by the controller's holder, signed by the module or
// not.
func TestProtocol_OnlyANodeReports(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	hostSeed, _ := b.register("module: host\nrequires: [mesh-bus]\nuses: [mesh-controller, mesh-build-machine]\n")
	builderSeed, _ := b.register(`module: builder
requires: [mesh-bus]
uses: [mesh-build-machine]
seats:
  mesh-build-machine:
    scope: mesh
    retain: 7d
    accepts: [build]
    emits: [built, failed]
    serves: [status]
`)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	report := manifest.SeatAcceptSubject(manifest.ControllerSeat, "report")
	build := manifest.SeatAcceptSubject("mesh-build-machine", "build")
	host := b.raw(hostSeed, "host")
	for _, subject := range []string{report, build, manifest.SeatNodeAcceptSubject(manifest.ControllerSeat, "alpha", "report")} {
		// Neither on the work queue's subject nor under its own prefix, through the admitter.
		for _, s := range []string{subject, manifest.AdmitSubject("host", subject)} {
			if !refusedPub(t, host, s) {
				t.Errorf("a module that uses the mesh's own seats published on %s", s)
			}
		}
	}
	builder := b.raw(builderSeed, "builder")
	if refusedPub(t, builder, manifest.AdmitSubject("builder", build)) {
		t.Errorf("the builder module may not queue its own seat's work on %s", build)
	}
	for _, s := range []string{report, manifest.AdmitSubject("builder", report)} {
		if !refusedPub(t, builder, s) {
			t.Errorf("the builder module published a host report on %s", s)
		}
	}

	// Past the bus: a report signed by the module, published by the operator's connection.
	seed, err := os.ReadFile(hostSeed)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	key, err := envelope.NewSigningKey(kp)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"node":"alpha","applied":0}`)
	h, err := envelope.Stamp(key, "host", "alpha", report, body, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: report, Header: h, Data: body}); err != nil {
		t.Fatalf("publish the module's report: %v", err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if n := reportCount(t, b, "refused"); n != 1 {
			return fmt.Errorf("%d reports from modules refused, want the module's one", n)
		}
		return nil
	})
	if n := reportCount(t, b, "accepted"); n != 0 {
		t.Fatalf("%d reports from modules accepted, want none", n)
	}
}

const protocolMailer = `module: mail
requires: [mesh-bus]
seats:
  mailer:
    scope: mesh
    retain: 1h
    accepts: [send, cancel]
    serves: [status]
    emits: [delivered]
`

// TestProtocol_HolderImplementsTheWholeProtocol: an instance with a handler for one verb of
// the seat's three parts does not claim it (HoldSeat says what is missing); once every
// accepted verb and served tool has a handler it claims, takes the jobs and answers the
// tool from the seat's subject.
func TestProtocol_HolderImplementsTheWholeProtocol(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mailSeed, _ := b.register(protocolMailer)
	shopSeed, _ := b.register("module: shop\nrequires: [mesh-bus]\nuses: [mailer]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	h := b.client(mailSeed)
	got := make(chan string, 4)
	job := func(_ context.Context, j sdk.Job) error { got <- j.Verb + " " + string(j.Data); return nil }
	if err := h.AcceptSeat("mailer", "send", job); err != nil {
		t.Fatalf("accept send: %v", err)
	}
	if missing := h.Missing("mailer"); !slices.Equal(missing, []string{"accepts cancel", "serves status"}) {
		t.Fatalf("missing %v, want accepts cancel and serves status", missing)
	}
	err := h.HoldSeat("mailer", sdk.SeatHandlers{Accepts: map[string]sdk.JobHandler{"send": job}})
	if !errors.Is(err, sdk.ErrIncomplete) || !strings.Contains(err.Error(), "accepts cancel") {
		t.Fatalf("HoldSeat without cancel and status: %v, want ErrIncomplete naming them", err)
	}
	if held, _ := h.Holding("mailer"); held {
		t.Fatal("an instance with one verb's handler of three holds the seat")
	}
	if st := seatStatus(t, b, "mailer"); st.Holder != "" {
		t.Fatalf("the seat has holder %q though no instance implements its protocol", st.Holder)
	}

	shop := b.client(shopSeed)
	if _, err := shop.Submit(ctx, "mailer", "send", "to a@b"); err != nil {
		t.Fatal(err)
	}
	if err := h.AcceptSeat("mailer", "cancel", job); err != nil {
		t.Fatal(err)
	}
	if missing := h.Missing("mailer"); !slices.Equal(missing, []string{"serves status"}) {
		t.Fatalf("missing %v, want serves status", missing)
	}
	if held, _ := h.Holding("mailer"); held {
		t.Fatal("an instance without the seat's tool holds the seat")
	}
	// The last handler completes the protocol: the instance claims the seat.
	if err := h.ServeSeat("mailer", "status", func(context.Context, sdk.Request) ([]byte, error) {
		return []byte(`{"queued":0}`), nil
	}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if held, _ := h.Holding("mailer"); !held {
			return errors.New("the complete holder does not hold the seat yet")
		}
		return nil
	})
	select {
	case j := <-got:
		if j != "send to a@b" {
			t.Fatalf("job %q", j)
		}
	case <-ctx.Done():
		t.Fatal("the job queued before the claim never reached the holder")
	}
	var reply []byte
	retryUntil(t, 5*time.Second, func() (err error) {
		reply, err = shop.Call(ctx, "mailer", "status", nil)
		return err
	})
	if string(reply) != `{"queued":0}` {
		t.Fatalf("status: %s", reply)
	}
}

// TestProtocol_SeatEvents: a seat's event emitted by its holder reaches a module consuming
// seat.mailer.delivered, with x-source the seat and the key naming the seat; an instance that
// does not hold the seat is refused by the sdk, and by the bus when it publishes directly;
// after the holder goes, the new holder's events are delivered and a connection under the
// old holder's instance name is refused; the audit log records the events as signed.
func TestProtocol_SeatEvents(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mailSeed, _ := b.register(protocolMailer)
	watchSeed, _ := b.register("module: watcher\nrequires: [mesh-bus]\nconsumes: [seat.mailer.delivered]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type seen struct{ source, key, body string }
	events := make(chan seen, 8)
	w := b.client(watchSeed)
	if err := w.On("seat.mailer.delivered", func(_ context.Context, e sdk.Event) error {
		events <- seen{e.Source, e.Key, string(e.Data)}
		return nil
	}); err != nil {
		t.Fatalf("on seat.mailer.delivered: %v", err)
	}
	noop := func(context.Context, sdk.Job) error { return nil }
	handlers := sdk.SeatHandlers{
		Accepts: map[string]sdk.JobHandler{"send": noop, "cancel": noop},
		Serves:  map[string]sdk.ToolHandler{"status": func(context.Context, sdk.Request) ([]byte, error) { return nil, nil }},
	}
	first := b.client(mailSeed)
	if err := first.HoldSeat("mailer", handlers); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if held, _ := first.Holding("mailer"); !held {
			return errors.New("no holder yet")
		}
		return nil
	})
	second := b.client(mailSeed)
	if err := second.HoldSeat("mailer", handlers); err != nil {
		t.Fatal(err)
	}
	if _, err := second.EmitSeat(ctx, "mailer", "delivered", "by the candidate"); !errors.Is(err, sdk.ErrNotHolder) {
		t.Fatalf("a candidate's EmitSeat: %v, want ErrNotHolder", err)
	}
	// Published past the sdk, the bus refuses the candidate's seat event.
	if !refusedPub(t, second.Conn(), manifest.SeatEventSubject("mailer", "delivered")) {
		t.Fatal("the bus let an instance that does not hold mailer publish its event")
	}
	if _, err := first.EmitSeat(ctx, "mailer", "delivered", "one"); err != nil {
		t.Fatalf("the holder's EmitSeat: %v", err)
	}
	want := seen{"mailer", "seat.mailer.delivered", "one"}
	select {
	case e := <-events:
		if e != want {
			t.Fatalf("delivered %+v, want %+v", e, want)
		}
	case <-ctx.Done():
		t.Fatal("the holder's seat event never reached its consumer")
	}

	// The holder goes and the candidate takes over. A connection under the old holder's
	// instance name (its key and name, as a holder that lost the seat while cut off would
	// come back) may no longer publish the seat's events.
	oldName := first.Instance()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if held, _ := second.Holding("mailer"); !held {
			return errors.New("the candidate has not taken over")
		}
		return nil
	})
	stale := connect(t, b.n.ClientURL(), mailSeed, nats.Name(oldName), nats.CustomInboxPrefix(manifest.InboxPrefix("mail")))
	defer stale.Close()
	if !refusedPub(t, stale, manifest.SeatEventSubject("mailer", "delivered")) {
		t.Fatal("the bus let the old holder's instance publish the seat's event after the failover")
	}
	if _, err := second.EmitSeat(ctx, "mailer", "delivered", "two"); err != nil {
		t.Fatalf("the new holder's EmitSeat: %v", err)
	}
	want.body = "two"
	select {
	case e := <-events:
		if e != want {
			t.Fatalf("delivered %+v, want %+v", e, want)
		}
	case <-ctx.Done():
		t.Fatal("the new holder's seat event never reached its consumer")
	}
	// The audit log checks each against the seat's holder's key (the declaring module's).
	b.waitAudited(10 * time.Second)
	recs := b.auditAll("mailer")
	if len(recs) != 2 {
		t.Fatalf("%d audit records of source mailer, want the 2 seat events", len(recs))
	}
	for _, r := range recs {
		if !r.Signed || !r.SourceMatches {
			t.Errorf("audit record %d of %s: signed %v (%s), source matches %v", r.N, r.Subject, r.Signed, r.SignatureError, r.SourceMatches)
		}
	}
}

const boundMailer = `module: mail
requires: [mesh-bus]
seats:
  mailer:
    scope: mesh
    retain: 1h
    accepts: [send]
    serves: [status]
    shapes:
      send:
        type: object
        required: [to]
        properties:
          to: {type: string}
          subject: {type: string}
`

// TestProtocol_BreakingChangesNameTheBound: a module that uses a seat is bound to the
// protocol it registered against. A new required field or a removed verb is refused naming
// it, (a) from the same declarer, (c) by removing the declarer (unless forced, and then the
// removal's event names it), and (b) from another module declaring the seat afterwards;
// additive changes are accepted.
func TestProtocol_BreakingChangesNameTheBound(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register(boundMailer)
	b.register("module: shop\nrequires: [mesh-bus]\nuses: [mailer]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	newRequired := strings.Replace(boundMailer, "required: [to]", "required: [to, subject]", 1)
	verbRemoved := strings.Replace(strings.Replace(boundMailer, "accepts: [send]", "accepts: [post]", 1), "      send:", "      post:", 1)
	refused := func(what, yaml, want string) {
		t.Helper()
		_, err := admin.Register(ctx, b.op, []byte(yaml))
		if !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "shop") {
			t.Errorf("%s: %v, want a refusal saying %q and naming shop", what, err, want)
		}
	}

	// (a) the same declarer
	refused("a new required field", newRequired, "makes subject a required field")
	refused("a removed verb", verbRemoved, "removes or renames accept send")
	additive := strings.Replace(strings.Replace(boundMailer, "accepts: [send]", "accepts: [send, cancel]", 1),
		"          subject: {type: string}\n", "          subject: {type: string}\n          bcc: {type: string}\n", 1)
	if _, err := admin.Register(ctx, b.op, []byte(additive)); err != nil {
		t.Fatalf("an additive change: %v", err)
	}

	// (c) removing the declarer
	if _, err := admin.Remove(ctx, b.op, api.RemoveRequest{Module: "mail"}); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "shop uses seat mailer") {
		t.Fatalf("removing the declarer of a used seat: %v, want a refusal naming shop", err)
	}
	if _, err := admin.Remove(ctx, b.op, api.RemoveRequest{Module: "mail", Force: true}); err != nil {
		t.Fatalf("a forced removal: %v", err)
	}
	events, err := b.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		m, err := events.GetLastMsgForSubject(ctx, manifest.NodeEventSubject("alpha", registry.EventRemoved))
		if err != nil {
			return err
		}
		if !strings.Contains(string(m.Data), `"forced":true`) || !strings.Contains(string(m.Data), "shop uses seat mailer") {
			return fmt.Errorf("the removal's event %s does not say it was forced past shop", m.Data)
		}
		return nil
	})

	// (b) another module declaring the seat afterwards
	postman := func(yaml string) string { return strings.Replace(yaml, "module: mail", "module: postman", 1) }
	refused("another declarer's new required field", postman(newRequired), "makes subject a required field")
	refused("another declarer's removed verb", postman(verbRemoved), "removes or renames accept send")
	if _, err := admin.Register(ctx, b.op, []byte(postman(additive))); err != nil {
		t.Fatalf("another declarer keeping the bound protocol: %v", err)
	}
}

// TestProtocol_ShapesAreChecked: a sender with shape checks on is refused a job that does
// not fit the verb's declared shape before it is sent; a holder gives such a job up (its
// handler never sees it; the node dead-letters it) and takes the ones that fit.
func TestProtocol_ShapesAreChecked(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mailSeed, _ := b.register(boundMailer)
	shopSeed, _ := b.register("module: shop\nrequires: [mesh-bus]\nuses: [mailer]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	got := make(chan string, 8)
	h := b.client(mailSeed)
	if err := h.HoldSeat("mailer", sdk.SeatHandlers{
		Accepts: map[string]sdk.JobHandler{"send": func(_ context.Context, j sdk.Job) error { got <- string(j.Data); return nil }},
		Serves:  map[string]sdk.ToolHandler{"status": func(context.Context, sdk.Request) ([]byte, error) { return []byte("{}"), nil }},
	}); err != nil {
		t.Fatal(err)
	}
	checked := b.client(shopSeed, sdk.WithShapeChecks())
	if _, err := checked.Submit(ctx, "mailer", "send", map[string]any{"subject": "no recipient"}); !errors.Is(err, sdk.ErrShape) || !strings.Contains(err.Error(), "lacks required field to") {
		t.Fatalf("a checked Submit of a job without its required field: %v, want ErrShape", err)
	}
	unchecked := b.client(shopSeed)
	if _, err := unchecked.Submit(ctx, "mailer", "send", map[string]any{"to": 42}); err != nil {
		t.Fatalf("an unchecked Submit: %v", err)
	}
	if _, err := checked.Submit(ctx, "mailer", "send", map[string]any{"to": "a@b"}); err != nil {
		t.Fatalf("a job that fits: %v", err)
	}
	select {
	case j := <-got:
		if j != `{"to":"a@b"}` {
			t.Fatalf("the holder's handler got %s, want only the job that fits", j)
		}
	case <-ctx.Done():
		t.Fatal("the job that fits never reached the holder")
	}
	queue := manifest.SeatStreamName("mailer")
	retryUntil(t, 20*time.Second, func() error {
		if n := len(deadLetters(t, b, manifest.DeadSubject(queue, manifest.SeatConsumerName("mailer", manifest.ScopeMesh, "")))); n != 1 {
			return fmt.Errorf("%d dead letters of the misshapen job, want 1", n)
		}
		return nil
	})
	select {
	case j := <-got:
		t.Fatalf("the holder's handler got %s as well", j)
	default:
	}
}

// TestProtocol_SubmitToAnUndeclaredSeat: a job for a seat no registered module declares yet
// is refused with an error that names the seat and what to register; once its module is
// registered, the same Submit queues the job for its holder.
func TestProtocol_SubmitToAnUndeclaredSeat(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	shopSeed, _ := b.register("module: shop\nrequires: [mesh-bus]\nuses: [fax]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	shop := b.client(shopSeed)
	_, err := shop.Submit(ctx, "fax", "send", "page 1")
	if !errors.Is(err, sdk.ErrUndeclaredSeat) || !strings.Contains(err.Error(), "seat fax") || !strings.Contains(err.Error(), "module register") {
		t.Fatalf("submit to an undeclared seat: %v, want ErrUndeclaredSeat naming fax and what to register", err)
	}
	b.register("module: faxer\nrequires: [mesh-bus]\nseats:\n  fax: {scope: mesh, retain: 1h, accepts: [send]}\n")
	if _, err := shop.Submit(ctx, "fax", "send", "page 1"); err != nil {
		t.Fatalf("submit once the seat's module is registered: %v", err)
	}
}

// TestProtocol_MeshSeatsFromConfiguration: a node is a candidate only for the mesh's own
// seats its configuration names. Left out of mesh-controller it answers no registration; a
// founding node left out of mesh-vault cannot hand genesis over, and says what to change.
func TestProtocol_MeshSeatsFromConfiguration(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.MeshSeats = []string{manifest.VaultSeat}
	b := newBedAt(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := admin.Register(ctx, b.op, []byte("module: shop\nrequires: [mesh-bus]\n")); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("register on a node that is no candidate for mesh-controller: %v, want no responders", err)
	}

	cfg = testConfig(t.TempDir(), "alpha")
	cfg.MeshSeats = []string{manifest.ControllerSeat}
	n := node.New(cfg, nil)
	n.CreateIdentity = true
	err := n.Open()
	if err == nil {
		n.Close()
		t.Fatal("a founding node that is no candidate for mesh-vault opened")
	}
	if !strings.Contains(err.Error(), "add mesh-vault to mesh-seats") {
		t.Fatalf("open: %v, want it to say to add mesh-vault to mesh-seats", err)
	}
}
