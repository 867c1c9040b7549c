package manifest_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
)

// TestManifest_Derive_Subjects derives every row of DESIGN §2.
func TestManifest_Derive_Subjects(t *testing.T) {
	for _, tc := range []struct {
		row  string
		yaml string
		got  func(*manifest.Derivation) []string
		want []string
	}{
		{"emits: order.placed", "module: billing\nrequires: [mesh-bus]\nemits: [order.placed]\n",
			func(d *manifest.Derivation) []string { return []string{d.Emits[0].Subject} },
			[]string{"mesh.mod.billing.event.order.placed"}},
		{"consumes: billing.order.placed", head + "consumes: [billing.order.placed]\n",
			func(d *manifest.Derivation) []string {
				return append([]string{d.EventsConsumer.Stream, d.EventsConsumer.Name}, d.EventsConsumer.FilterSubjects...)
			},
			[]string{"EVENTS", "m", "mesh.mod.billing.event.order.placed", "mesh.replay.m.mesh.>"}},
		{"consumes: *.download.completed", head + "consumes: [\"*.download.completed\"]\n",
			func(d *manifest.Derivation) []string { return d.EventsConsumer.FilterSubjects },
			[]string{"mesh.mod.*.event.download.completed", "mesh.replay.m.mesh.>"}},
		{"consumes: billing.**", head + "consumes: [\"billing.**\"]\n",
			func(d *manifest.Derivation) []string { return d.EventsConsumer.FilterSubjects },
			[]string{"mesh.mod.billing.event.>", "mesh.replay.m.mesh.>"}},
		{`consumes: "**"`, head + "consumes: [\"**\"]\n",
			func(d *manifest.Derivation) []string { return d.EventsConsumer.FilterSubjects },
			[]string{"mesh.*.*.event.>", "mesh.seat.*.v2.event.>", "mesh.seat.*.v3.event.>", "mesh.seat.*.v4.event.>", "mesh.seat.*.v5.event.>",
				"mesh.seat.*.v6.event.>", "mesh.seat.*.v7.event.>", "mesh.seat.*.v8.event.>", "mesh.seat.*.v9.event.>", "mesh.replay.m.mesh.>"}},
		{"tools: status", "module: billing\nrequires: [mesh-bus]\ntools: [status]\n",
			func(d *manifest.Derivation) []string { return []string{d.Tools[0].Subject, d.Tools[0].Queue} },
			[]string{"mesh.mod.billing.tool.status", "billing"}},
		{"seat S accepts: send", head + "seats:\n  sender: {scope: mesh, retain: 7d, accepts: [send]}\n",
			func(d *manifest.Derivation) []string {
				s := d.Seats[0]
				return []string{s.Accepts[0].Subject, s.Stream.Name, s.Stream.Subjects[0], string(s.Stream.Retention), s.Stream.MaxAge.String(),
					s.Consumer.Name, s.Consumer.FilterSubjects[0]}
			},
			[]string{"mesh.seat.sender.accept.send", "SEAT_sender", "mesh.seat.sender.accept.>", "workqueue", "168h0m0s",
				"seat-sender", "mesh.seat.sender.accept.>"}},
		{"node-scoped seat S accepts: send", head + "seats:\n  worker: {scope: node, retain: 12h, accepts: [send]}\n",
			func(d *manifest.Derivation) []string {
				s := d.Seats[0]
				c, ok, err := d.SeatConsumer("worker", "n1")
				if !ok || err != nil {
					t.Fatalf("SeatConsumer: %v, %v", ok, err)
				}
				return []string{s.Accepts[0].Subject, s.Stream.Subjects[0], s.Stream.MaxAge.String(), c.Stream, c.Name, c.FilterSubjects[0],
					manifest.SeatNodeAcceptSubject("worker", "n1", "send")}
			},
			[]string{"mesh.seat.worker.node.<node>.accept.send", "mesh.seat.worker.node.*.accept.>", "12h0m0s", "SEAT_worker", "seat-worker-n1",
				"mesh.seat.worker.node.n1.accept.>", "mesh.seat.worker.node.n1.accept.send"}},
		{"seat S emits: delivered", head + "seats:\n  sender: {scope: mesh, emits: [delivered]}\n",
			func(d *manifest.Derivation) []string { return []string{d.Seats[0].Emits[0].Subject} },
			[]string{"mesh.seat.sender.event.delivered"}},
		{"seat S serves: status", head + "seats:\n  sender: {scope: mesh, serves: [status]}\n",
			func(d *manifest.Derivation) []string {
				return []string{d.Seats[0].Serves[0].Subject, d.Seats[0].Serves[0].Queue}
			},
			[]string{"mesh.seat.sender.tool.status", "sender"}},
		{"uses: S", head + "uses: [sender]\n",
			func(d *manifest.Derivation) []string { return append(d.Uses[0].Publish, d.Uses[0].Request...) },
			[]string{"mesh.seat.sender.accept.>", "mesh.seat.sender.node.*.accept.>", "mesh.seat.sender.tool.>"}},
		{"node N's own events", "module: m\n",
			func(*manifest.Derivation) []string {
				return []string{manifest.NodeEventSubject("n1", "joined"), manifest.NodeEventSubject("n1", "left"), manifest.NodeEventSubject("n1", "unreachable")}
			},
			[]string{"mesh.node.n1.event.joined", "mesh.node.n1.event.left", "mesh.node.n1.event.unreachable"}},
		{"node N's declaration", "module: m\n",
			func(*manifest.Derivation) []string {
				return []string{manifest.StateSubject("n1"), manifest.StateStream().Subjects[0]}
			},
			[]string{"mesh.state.node.n1", "mesh.state.node.*"}},
		{"dead letters", head + "consumes: [b.x]\n",
			func(d *manifest.Derivation) []string {
				return []string{d.EventsConsumer.DeadSubject, manifest.DeadSubject("SEAT_s", "seat-s"), manifest.DeadStream().Subjects[0]}
			},
			[]string{"mesh.dead.EVENTS.m", "mesh.dead.SEAT_s.seat-s", "mesh.dead.*.*"}},
	} {
		t.Run(tc.row, func(t *testing.T) {
			d := mustDerive(t, tc.yaml)
			if got := tc.got(d); !slices.Equal(got, tc.want) {
				t.Fatalf("derived\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// TestManifest_Derive_Permissions is the composition test of design 29 §12: the derived
// permission set equals what the declaration implies, entry for entry.
func TestManifest_Derive_Permissions(t *testing.T) {
	d := mustDerive(t, `
module: telegram
requires: [mesh-bus]
emits: [message.received]
consumes: [billing.order.placed, "*.download.completed", "builder.**", builder.built]
tools: [status]
uses: [mailer]
seats:
  telegram-sender:
    scope: mesh
    retain: 7d
    accepts: [send]
    emits: [delivered, failed]
    serves: [status]
  telegram-poller:
    scope: node
    retain: 1h
    accepts: [poll]
`)
	want := manifest.Permissions{
		Publish: []string{
			"$JS.ACK.EVENTS.telegram.>",
			"$JS.API.CONSUMER.INFO.EVENTS.telegram",
			"$JS.API.CONSUMER.MSG.NEXT.EVENTS.telegram",
			"_INBOX.operator.>",
			"mesh.admit.telegram.mesh.mod.telegram.event.message.received",
			"mesh.admit.telegram.mesh.seat.mailer.accept.>",
			"mesh.admit.telegram.mesh.seat.mailer.node.*.accept.>",
			"mesh.mod.telegram.stats.*",
			"mesh.seat.mailer.tool.>",
		},
		Subscribe: []manifest.Subscription{
			{Subject: "_INBOX.telegram.>"},
			{Subject: "mesh.mod.telegram.tool.status", Queue: "telegram"},
		},
		AllowResponses: true,
	}
	assertPermissions(t, "module", d.Permissions, want)
	if got, want := d.Inbox, "_INBOX.telegram"; got != want {
		t.Fatalf("Inbox=%q, want %q", got, want)
	}

	holder, err := d.HolderPermissions("telegram-sender", "")
	if err != nil {
		t.Fatal(err)
	}
	assertPermissions(t, "holder of telegram-sender", holder, manifest.Permissions{
		Publish: []string{
			"$JS.ACK.SEAT_telegram-sender.seat-telegram-sender.>",
			"$JS.API.CONSUMER.INFO.SEAT_telegram-sender.seat-telegram-sender",
			"$JS.API.CONSUMER.MSG.NEXT.SEAT_telegram-sender.seat-telegram-sender",
			"_INBOX.operator.>",
			"mesh.admit.telegram.mesh.seat.telegram-sender.event.delivered",
			"mesh.admit.telegram.mesh.seat.telegram-sender.event.failed",
		},
		Subscribe:      []manifest.Subscription{{Subject: "mesh.seat.telegram-sender.tool.status", Queue: "telegram-sender"}},
		AllowResponses: true,
	})

	holder, err = d.HolderPermissions("telegram-poller", "n2")
	if err != nil {
		t.Fatal(err)
	}
	assertPermissions(t, "holder of telegram-poller on n2", holder, manifest.Permissions{
		Publish: []string{
			"$JS.ACK.SEAT_telegram-poller.seat-telegram-poller-n2.>",
			"$JS.API.CONSUMER.INFO.SEAT_telegram-poller.seat-telegram-poller-n2",
			"$JS.API.CONSUMER.MSG.NEXT.SEAT_telegram-poller.seat-telegram-poller-n2",
		},
		Subscribe: []manifest.Subscription{},
	})

	merged := d.Permissions.Merge(holder)
	if got, want := len(merged.Publish), len(d.Permissions.Publish)+len(holder.Publish); got != want {
		t.Fatalf("Merge: %d publish entries, want %d", got, want)
	}
	if !slices.IsSorted(merged.Publish) {
		t.Fatalf("Merge: unsorted %q", merged.Publish)
	}
}

func assertPermissions(t *testing.T, who string, got, want manifest.Permissions) {
	t.Helper()
	if !slices.Equal(got.Publish, want.Publish) {
		t.Errorf("%s: Publish\n%q\nwant\n%q", who, got.Publish, want.Publish)
	}
	if !slices.Equal(got.Subscribe, want.Subscribe) {
		t.Errorf("%s: Subscribe\n%v\nwant\n%v", who, got.Subscribe, want.Subscribe)
	}
	if got.AllowResponses != want.AllowResponses {
		t.Errorf("%s: AllowResponses=%v, want %v", who, got.AllowResponses, want.AllowResponses)
	}
}

func TestManifest_Derive_MinimalFilters(t *testing.T) {
	for _, tc := range []struct {
		name     string
		consumes string
		want     []string
	}{
		{"a covered event is dropped", `[billing.order.placed, "billing.**"]`, []string{"mesh.mod.billing.event.>", "mesh.replay.m.mesh.>"}},
		{"a covered pattern is dropped", `["billing.order.*", "*.order.*", billing.x]`, []string{"mesh.mod.*.event.order.*", "mesh.mod.billing.event.x", "mesh.replay.m.mesh.>"}},
		{"** covers everything", `[billing.order.placed, "**", "*.**", seat.mailer.sent]`, []string{"mesh.*.*.event.>", "mesh.seat.*.v2.event.>", "mesh.seat.*.v3.event.>", "mesh.seat.*.v4.event.>", "mesh.seat.*.v5.event.>",
			"mesh.seat.*.v6.event.>", "mesh.seat.*.v7.event.>", "mesh.seat.*.v8.event.>", "mesh.seat.*.v9.event.>", "mesh.replay.m.mesh.>"}},
		{"partial overlaps are kept", `["*.download.completed", "builder.**"]`, []string{"mesh.mod.*.event.download.completed", "mesh.mod.builder.event.>", "mesh.replay.m.mesh.>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := mustDerive(t, head+"consumes: "+tc.consumes+"\n")
			if got := d.EventsConsumer.FilterSubjects; !slices.Equal(got, tc.want) {
				t.Fatalf("FilterSubjects=%q, want %q", got, tc.want)
			}
			for i, a := range d.EventsConsumer.FilterSubjects {
				for j, b := range d.EventsConsumer.FilterSubjects {
					if i != j && within(a, b) {
						t.Fatalf("filter %q lies within %q: JetStream refuses it (10138)", b, a)
					}
				}
			}
		})
	}
	d := mustDerive(t, head+"consumes: [billing.order.placed, \"billing.**\"]\n")
	if got, want := d.Consumes[0].CoveredBy, "billing.**"; got != want {
		t.Fatalf("CoveredBy=%q, want %q", got, want)
	}
}

func TestManifest_Derive_Consumers(t *testing.T) {
	d := mustDerive(t, head+"consumes: [b.x]\nseats:\n  s: {scope: mesh, retain: 1d, accepts: [go]}\n")
	ev := *d.EventsConsumer
	if ev.AckPolicy != manifest.AckExplicit || ev.MaxAckPending != 32 || ev.MaxDeliver != 5 || ev.DeliverPolicy != manifest.DeliverNew {
		t.Fatalf("EVENTS consumer %+v", ev)
	}
	if len(ev.BackOff) >= ev.MaxDeliver || ev.BackOff[0] != manifest.BackOff1 {
		t.Fatalf("BackOff=%v: JetStream needs fewer steps than MaxDeliver", ev.BackOff)
	}
	sc := *d.Seats[0].Consumer
	if sc.DeliverPolicy != manifest.DeliverAll || sc.AckPolicy != manifest.AckExplicit || sc.DeadSubject != "mesh.dead.SEAT_s.seat-s" {
		t.Fatalf("seat consumer %+v", sc)
	}
	audit := manifest.AuditConsumer("n1")
	if audit.Name != "audit-n1" || audit.Stream != "EVENTS" || len(audit.FilterSubjects) != 0 || audit.AckPolicy != manifest.AckAll {
		t.Fatalf("audit consumer %+v", audit)
	}

	if d := mustDerive(t, head+"tools: [t]\n"); d.EventsConsumer != nil {
		t.Fatalf("a module consuming nothing got an EVENTS consumer %+v", d.EventsConsumer)
	}
	if d := mustDerive(t, head+"seats:\n  s: {scope: mesh, serves: [t]}\n"); d.Seats[0].Stream != nil || d.Seats[0].Consumer != nil {
		t.Fatal("a seat accepting nothing got a work queue")
	}
}

func TestDerivation_Seat_Errors(t *testing.T) {
	d := mustDerive(t, head+"seats:\n  n: {scope: node, retain: 1d, accepts: [go]}\n  g: {scope: mesh, retain: 1d, accepts: [go]}\n")
	for _, node := range []string{"", "*", ">", "n.1", "N1", manifest.NodePlaceholder} {
		if _, err := d.HolderPermissions("n", node); !errors.Is(err, manifest.ErrInvalidNode) {
			t.Errorf("HolderPermissions(n, %q): err=%v, want ErrInvalidNode", node, err)
		}
		if _, _, err := d.SeatConsumer("n", node); !errors.Is(err, manifest.ErrInvalidNode) {
			t.Errorf("SeatConsumer(n, %q): err=%v, want ErrInvalidNode", node, err)
		}
	}
	if _, err := d.HolderPermissions("g", ""); err != nil {
		t.Errorf("a mesh-scoped seat needs no node: %v", err)
	}
	if _, err := d.HolderPermissions("x", "n1"); !errors.Is(err, manifest.ErrUnknownSeat) {
		t.Errorf("err=%v, want ErrUnknownSeat", err)
	}
}

func TestManifest_Derive_NoBus(t *testing.T) {
	d := mustDerive(t, "module: m\nrequires: [postgres]\nsecrets: [db-password]\n")
	if d.Bus || d.Inbox != "" || !d.Permissions.IsZero() {
		t.Fatalf("a module without the bus got an account: %+v", d)
	}
}

func TestManifest_Derive_Refused(t *testing.T) {
	m, err := manifest.Parse([]byte("module: m\nemits: [\">\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Derive(); len(refusals(t, err)) == 0 {
		t.Fatal("Derive derived from an invalid manifest")
	}
}

// TestStreams_Disjoint: the mesh's streams never capture each other's subjects, and EVENTS
// never captures a tool call or a work item (DESIGN §3).
func TestStreams_Disjoint(t *testing.T) {
	d := mustDerive(t, head+"seats:\n  a: {scope: mesh, retain: 1d, accepts: [x]}\n  b: {scope: node, retain: 1d, accepts: [x]}\n")
	streams := []manifest.Stream{manifest.EventsStream(), manifest.StateStream(), manifest.DeadStream(), *d.Seats[0].Stream, *d.Seats[1].Stream}
	for i, a := range streams {
		for _, b := range streams[i+1:] {
			for _, sa := range a.Subjects {
				for _, sb := range b.Subjects {
					if collide(sa, sb) {
						t.Errorf("%s %q collides with %s %q", a.Name, sa, b.Name, sb)
					}
				}
			}
		}
	}
	for _, s := range []string{"mesh.*.*.tool.>", "mesh.seat.*.accept.>", "mesh.seat.*.node.*.accept.>",
		"mesh.seat.*.v2.accept.>", "mesh.seat.*.v9.tool.>", "mesh.seat.*.v3.node.*.accept.>"} {
		for _, e := range manifest.EventsStream().Subjects {
			if collide(e, s) {
				t.Errorf("EVENTS captures %s", s)
			}
		}
	}
	// nats-server refuses a stream whose own subjects overlap, and a consumer whose filters do.
	events := manifest.EventsStream().Subjects
	for i, a := range events {
		for _, b := range events[i+1:] {
			if collide(a, b) {
				t.Errorf("EVENTS's own subjects %q and %q overlap", a, b)
			}
		}
	}
	if !manifest.IsEvent("mesh.seat.mailer.v2.event.sent") || manifest.IsEvent("mesh.seat.mailer.v2.accept.send") {
		t.Error("IsEvent does not tell a later version's event from its job")
	}
	if collide(manifest.AllEvents, manifest.ReplayEvents) || collide(manifest.AllEvents, manifest.ReplayFilter("m")) {
		t.Errorf("replays overlap %s", manifest.AllEvents)
	}
	replay := manifest.ReplaySubject("billing", "mesh.mod.shop.event.order.placed")
	if c, o, ok := manifest.ReplayOf(replay); !ok || c != "billing" || o != "mesh.mod.shop.event.order.placed" ||
		!manifest.Matches(manifest.ReplayEvents, replay) || !manifest.Matches(manifest.ReplayFilter("billing"), replay) ||
		manifest.Matches(manifest.ReplayFilter("shop"), replay) || manifest.Matches(manifest.AllEvents, replay) {
		t.Errorf("replay subject %s: ReplayOf %q %q %v", replay, c, o, ok)
	}
	if s := manifest.EventsStream(); s.MaxAge != manifest.DefaultEventsMaxAge || s.MaxMsgsPerSubject != 0 || s.Duplicates < 2*time.Minute {
		t.Errorf("EVENTS %+v", s)
	}
	if s := manifest.StateStream(); s.MaxMsgsPerSubject != 1 {
		t.Errorf("STATE %+v", s)
	}
}

func TestConsumeSubject(t *testing.T) {
	for in, want := range map[string]string{
		"billing.order.placed": "mesh.mod.billing.event.order.placed",
		"*.download.completed": "mesh.mod.*.event.download.completed",
		"billing.**":           "mesh.mod.billing.event.>",
		"*.**":                 "mesh.mod.*.event.>",
		"**":                   "mesh.*.*.event.>",
		"billing.order.*":      "mesh.mod.billing.event.order.*",
	} {
		if got, err := manifest.ConsumeSubject(in); err != nil || got != want {
			t.Errorf("ConsumeSubject(%q)=%q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "billing", "*", "billing.>", "#", "mesh.mod.b.event.x", "a.**.b", "A.b"} {
		if got, err := manifest.ConsumeSubject(in); err == nil {
			t.Errorf("ConsumeSubject(%q)=%q, want an error", in, got)
		}
	}
}

// TestManifest_Derive_NoDeadLetterGrant: neither a module nor a seat's holder may publish on
// a dead subject (the node writes DEAD, issue 11); each may still terminate its messages on
// its ack subject, which is how it gives up with a reason.
func TestManifest_Derive_NoDeadLetterGrant(t *testing.T) {
	d := mustDerive(t, `
module: m
requires: [mesh-bus]
emits: [x]
consumes: ["**"]
seats:
  s: {scope: mesh, retain: 1h, accepts: [run], emits: [done]}
  p: {scope: node, retain: 1h, accepts: [poll]}
`)
	sets := map[string]manifest.Permissions{"module": d.Permissions}
	for _, seat := range []string{"s", "p"} {
		h, err := d.HolderPermissions(seat, "n1")
		if err != nil {
			t.Fatal(err)
		}
		sets["holder of "+seat] = h
	}
	dead := []string{
		manifest.DeadSubject(manifest.EventsStreamName, "m"), manifest.DeadSubject("SEAT_s", "seat-s"),
		manifest.DeadSubject("SEAT_p", "seat-p-n1"), manifest.DeadSubject(manifest.EventsStreamName, "other"),
	}
	for who, p := range sets {
		for _, grant := range p.Publish {
			for _, subj := range dead {
				if manifest.Matches(grant, subj) {
					t.Errorf("%s may publish %s (grant %q)", who, subj, grant)
				}
			}
		}
	}
	for who, term := range map[string]string{
		"module": "$JS.ACK.EVENTS.m.1.2.3.4.5", "holder of s": "$JS.ACK.SEAT_s.seat-s.1.2.3.4.5",
	} {
		if !slices.ContainsFunc(sets[who].Publish, func(g string) bool { return manifest.Matches(g, term) }) {
			t.Errorf("%s may not terminate on its ack subject %s: %q", who, term, sets[who].Publish)
		}
	}
}

// TestDerivation_HolderGrant: a seat's holder answers its tools into the operator's inbox and
// its callers', and a seat that serves nothing answers nobody.
func TestDerivation_HolderGrant(t *testing.T) {
	m, err := manifest.Parse([]byte("module: desk\nrequires: [mesh-bus]\nseats:\n  serving: {scope: mesh, retain: 1h, accepts: [work], serves: [status]}\n  quiet: {scope: mesh, retain: 1h, accepts: [work]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.Derive()
	if err != nil {
		t.Fatal(err)
	}
	g, err := d.HolderGrant("serving", "", []string{"shop", "billing"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"_INBOX.operator.>", "_INBOX.shop.>", "_INBOX.billing.>"} {
		if !slices.Contains(g.Publish, want) {
			t.Errorf("the holder of a serving seat may not answer into %s: %v", want, g.Publish)
		}
	}
	if slices.Contains(g.Publish, "_INBOX.>") {
		t.Errorf("the holder may answer into every inbox: %v", g.Publish)
	}
	q, err := d.HolderGrant("quiet", "", []string{"shop"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range q.Publish {
		if strings.HasPrefix(p, "_INBOX.") {
			t.Errorf("the holder of a seat serving nothing may answer into %s", p)
		}
	}
}
