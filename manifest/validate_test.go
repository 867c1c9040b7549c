package manifest_test

import (
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// head starts a manifest that requires the bus, so a case shows only what it refuses.
const head = "module: m\nrequires: [mesh-bus]\n"

// TestManifest_Validate_Refusals covers every per-manifest refusal of issue 3 (rules 1–5),
// each with the field and value it names and what it says to write instead.
func TestManifest_Validate_Refusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		yaml    string
		code    manifest.Code
		field   string
		value   string
		instead string
	}{
		// Rule 1: the subject grammar, the old bus's forms and the wire's wildcards.
		{"subject in consumes", head + "consumes: [mesh.mod.billing.event.order.placed]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.mod.billing.event.order.placed", "write billing.order.placed"},
		{"wildcard subject in consumes", head + "consumes: [mesh.mod.*.event.download.completed]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.mod.*.event.download.completed", "write *.download.completed"},
		{"every-event subject", head + "consumes: [\"mesh.*.*.event.>\"]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.*.*.event.>", "write **"},
		{"kind token without mesh", head + "consumes: [billing.event.order.placed]\n",
			manifest.CodeSubject, "consumes[0]", "billing.event.order.placed", "write billing.order.placed"},
		{"AMQP routing key", head + "consumes: [module.billing.order.placed]\n",
			manifest.CodeSubject, "consumes[0]", "module.billing.order.placed", "write billing.order.placed"},
		{"AMQP key with mesh origin", head + "consumes: [mesh.billing.order.placed]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.billing.order.placed", "write billing.order.placed"},
		{"AMQP key with node origin", head + "consumes: [node.n1.joined]\n",
			manifest.CodeSubject, "consumes[0]", "node.n1.joined", "node events are the mesh's own"},
		{"AMQP wildcard", head + "consumes: [\"#\"]\n",
			manifest.CodeSubject, "consumes[0]", "#", "write **"},
		{"AMQP wildcard after emitter", head + "consumes: [\"billing.#\"]\n",
			manifest.CodeSubject, "consumes[0]", "billing.#", "write billing.**"},
		{"AMQP key for every module", head + "consumes: [\"module.#\"]\n",
			manifest.CodeSubject, "consumes[0]", "module.#", "write *.**"},
		{"NATS wildcard", head + "consumes: [\">\"]\n",
			manifest.CodeSubject, "consumes[0]", ">", "write **"},
		{"NATS wildcard after emitter", head + "consumes: [\"billing.>\"]\n",
			manifest.CodeSubject, "consumes[0]", "billing.>", "write billing.**"},
		{"every subject of a module", head + "consumes: [\"mesh.mod.billing.>\"]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.mod.billing.>", "write billing.**"},
		{"every subject of every module", head + "consumes: [\"mesh.mod.>\"]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.mod.>", "write *.**"},
		{"every subject of a seat", head + "consumes: [\"mesh.seat.mailer.>\"]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.seat.mailer.>", "write seat.mailer.**"},
		{"a seat's event subject", head + "consumes: [mesh.seat.mailer.v2.event.sent]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.seat.mailer.v2.event.sent", "write seat.mailer.sent"},
		{"seat accept in consumes", head + "consumes: [mesh.seat.mailer.accept.send]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.seat.mailer.accept.send", "write uses: [mailer]"},
		{"tool in consumes", head + "consumes: [mesh.mod.billing.tool.status]\n",
			manifest.CodeSubject, "consumes[0]", "mesh.mod.billing.tool.status", "a tool is called, not consumed"},
		{"JetStream API", head + "consumes: [$JS.API.CONSUMER.INFO.EVENTS.m]\n",
			manifest.CodeSubject, "consumes[0]", "$JS.API.CONSUMER.INFO.EVENTS.m", "remove it"},
		{"inbox", head + "consumes: [\"_INBOX.m.>\"]\n",
			manifest.CodeSubject, "consumes[0]", "_INBOX.m.>", "remove it"},
		{"state subject", head + "secrets: [mesh.state.node.n1]\n",
			manifest.CodeSubject, "secrets[0]", "mesh.state.node.n1", "the mesh's own"},
		{"subject in emits", head + "emits: [mesh.mod.m.event.order.placed]\n",
			manifest.CodeSubject, "emits[0]", "mesh.mod.m.event.order.placed", "write order.placed"},
		{"AMQP key in emits", head + "emits: [module.m.order.placed]\n",
			manifest.CodeSubject, "emits[0]", "module.m.order.placed", "write order.placed"},
		{"subject in tools", head + "tools: [mesh.mod.m.tool.status]\n",
			manifest.CodeSubject, "tools[0]", "mesh.mod.m.tool.status", "write status"},
		{"subject in uses", head + "uses: [\"mesh.seat.mailer.accept.>\"]\n",
			manifest.CodeSubject, "uses[0]", "mesh.seat.mailer.accept.>", "write mailer"},
		{"versioned seat subject", head + "uses: [mesh.seat.mailer.v2.accept.send]\n",
			manifest.CodeSubject, "uses[0]", "mesh.seat.mailer.v2.accept.send", "write mailer"},
		{"versioned kind token", head + "seats:\n  s: {scope: mesh, retain: 1d, accepts: [s.v2.accept.send]}\n",
			manifest.CodeSubject, "seats.s.accepts[0]", "s.v2.accept.send", "write send"},
		{"node-scoped accept subject", head + "seats:\n  s: {scope: node, retain: 1d, accepts: [mesh.seat.s.node.n1.accept.send]}\n",
			manifest.CodeSubject, "seats.s.accepts[0]", "mesh.seat.s.node.n1.accept.send", "write send"},
		{"subject in seat emits", head + "seats:\n  s: {scope: mesh, emits: [mesh.seat.s.event.delivered]}\n",
			manifest.CodeSubject, "seats.s.emits[0]", "mesh.seat.s.event.delivered", "write delivered"},
		{"subject in seat serves", head + "seats:\n  s: {scope: mesh, serves: [mesh.seat.s.tool.status]}\n",
			manifest.CodeSubject, "seats.s.serves[0]", "mesh.seat.s.tool.status", "write status"},

		// Rule 2: relationships without the bus.
		{"emits without the bus", "module: m\nemits: [x]\n",
			manifest.CodeNoBus, "requires", "", "write requires: [mesh-bus]"},
		{"seats without the bus", "module: m\nrequires: [postgres]\nseats:\n  s: {scope: mesh}\n",
			manifest.CodeNoBus, "requires", "postgres", "write requires: [mesh-bus, postgres]"},
		{"uses without the bus", "module: m\nuses: [mailer]\n",
			manifest.CodeNoBus, "requires", "", "write requires: [mesh-bus]"},

		// Rule 3: an emit names one event.
		{"wildcard emit", head + "emits: [order.*]\n",
			manifest.CodeWildcardEmit, "emits[0]", "order.*", "wildcards belong in consumes"},
		{"rest-wildcard emit", head + "emits: [\"**\"]\n",
			manifest.CodeWildcardEmit, "emits[0]", "**", "write one event's name"},
		{"wildcard seat emit", head + "seats:\n  s: {scope: mesh, emits: [\"*\"]}\n",
			manifest.CodeWildcardEmit, "seats.s.emits[0]", "*", "write one event's name"},

		// Rule 4: reserved names.
		{"mesh seat the nodes hold", head + "seats:\n  mesh-vault: {scope: mesh}\n",
			manifest.CodeReserved, "seats.mesh-vault", "mesh-vault", "uses: [mesh-vault]"},
		{"mesh seat that is none of the mesh's", head + "seats:\n  mesh-mailer: {scope: mesh}\n",
			manifest.CodeReserved, "seats.mesh-mailer", "mesh-mailer", "e.g. mailer"},
		{"mesh seat replaced with less than its protocol", head + "seats:\n  mesh-git: {scope: mesh, emits: [pushed]}\n",
			manifest.CodeReserved, "seats.mesh-git.serves", "", "add archive"},
		{"mesh seat replaced with another scope", head + "seats:\n  mesh-git: {scope: node, emits: [pushed], serves: [archive]}\n",
			manifest.CodeReserved, "seats.mesh-git.scope", "node", "scope: mesh"},
		{"module named mesh", "module: mesh\n",
			manifest.CodeReserved, "module", "mesh", "choose another name"},
		{"module named node", "module: node\n",
			manifest.CodeReserved, "module", "node", "choose another name"},
		{"module named like an audit consumer", "module: audit-n1\n",
			manifest.CodeReserved, "module", "audit-n1", "e.g. n1-audit"},

		// Rule 5: names, keys, duplicates, scope and retain.
		{"missing module", "requires: [mesh-bus]\n",
			manifest.CodeName, "module", "", "write module: <name>"},
		{"upper-case module", "module: Billing\n",
			manifest.CodeName, "module", "Billing", "write billing"},
		{"dotted module", "module: a.b\n",
			manifest.CodeName, "module", "a.b", "write a-b"},
		{"leading dash", "module: -a\n",
			manifest.CodeName, "module", "-a", "write a"},
		{"long module", "module: " + strings.Repeat("a", 65) + "\n",
			manifest.CodeName, "module", strings.Repeat("a", 65), "lower-case"},
		{"upper-case event", head + "emits: [Order.Placed]\n",
			manifest.CodeName, "emits[0]", "Order.Placed", "write order.placed"},
		{"empty event part", head + "emits: [order..placed]\n",
			manifest.CodeName, "emits[0]", "order..placed", "lower-case"},
		{"underscore tool", head + "tools: [get_status]\n",
			manifest.CodeName, "tools[0]", "get_status", "write get-status"},
		{"dotted tool", head + "tools: [get.status]\n",
			manifest.CodeName, "tools[0]", "get.status", "write get-status"},
		{"wildcard tool", head + "tools: [\"*\"]\n",
			manifest.CodeName, "tools[0]", "*", "write one name"},
		{"empty uses", head + "uses: [\"\"]\n",
			manifest.CodeName, "uses[0]", "", "write a seat name"},
		{"secret", head + "secrets: [Bot_Token]\n",
			manifest.CodeName, "secrets[0]", "Bot_Token", "write bot-token"},
		{"requirement", "module: m\nrequires: [Postgres]\n",
			manifest.CodeName, "requires[0]", "Postgres", "write postgres"},
		{"built on itself", "module: m\nbuild: {from: r/m, run: make, on: [m]}\n",
			manifest.CodeName, "build.on[0]", "m", "remove it"},
		{"consumes a module, no event", head + "consumes: [billing]\n",
			manifest.CodeName, "consumes[0]", "billing", "write billing.<event>, or billing.**"},
		{"consumes a lone star", head + "consumes: [\"*\"]\n",
			manifest.CodeName, "consumes[0]", "*", "write **"},
		{"rest wildcard first", head + "consumes: [\"**.download.completed\"]\n",
			manifest.CodeName, "consumes[0]", "**.download.completed", "write *.download.completed"},
		{"rest wildcard inside", head + "consumes: [\"billing.**.placed\"]\n",
			manifest.CodeName, "consumes[0]", "billing.**.placed", "write billing.**"},
		{"partial wildcard", head + "consumes: [\"bill*.order.placed\"]\n",
			manifest.CodeName, "consumes[0]", "bill*.order.placed", "write *.order.placed"},
		{"upper-case pattern", head + "consumes: [Billing.order.placed]\n",
			manifest.CodeName, "consumes[0]", "Billing.order.placed", "write billing.order.placed"},
		{"duplicate emit", head + "emits: [a, b, a]\n",
			manifest.CodeDuplicate, "emits[2]", "a", "remove it"},
		{"duplicate consume", head + "consumes: [b.x, b.x]\n",
			manifest.CodeDuplicate, "consumes[1]", "b.x", "remove it"},
		{"duplicate verb", head + "seats:\n  s: {scope: mesh, retain: 1d, accepts: [send, send]}\n",
			manifest.CodeDuplicate, "seats.s.accepts[1]", "send", "remove it"},
		{"duplicate requirement", "module: m\nrequires: [mesh-bus, mesh-bus]\n",
			manifest.CodeDuplicate, "requires[1]", "mesh-bus", "remove it"},
		{"missing scope", head + "seats:\n  s: {retain: 1d, accepts: [send]}\n",
			manifest.CodeScope, "seats.s.scope", "", "write scope: mesh"},
		{"invalid scope", head + "seats:\n  s: {scope: cluster}\n",
			manifest.CodeScope, "seats.s.scope", "cluster", "or scope: node"},
		{"missing retain", head + "seats:\n  s: {scope: mesh, accepts: [send]}\n",
			manifest.CodeRetain, "seats.s.retain", "", "write retain: 7d"},
		{"retain in words", head + "seats:\n  s: {scope: mesh, retain: 7 days, accepts: [send]}\n",
			manifest.CodeRetain, "seats.s.retain", "7 days", "retain: 7d"},
		{"zero retain", head + "seats:\n  s: {scope: mesh, retain: 0d, accepts: [send]}\n",
			manifest.CodeRetain, "seats.s.retain", "0d", "retain: 7d"},
		{"negative retain", head + "seats:\n  s: {scope: mesh, retain: -1h, accepts: [send]}\n",
			manifest.CodeRetain, "seats.s.retain", "-1h", "retain: 7d"},
		{"retain JetStream refuses", head + "seats:\n  s: {scope: mesh, retain: 1ns, accepts: [send]}\n",
			manifest.CodeRetain, "seats.s.retain", "1ns", "retain: 7d"},
		{"unit-less retain", head + "seats:\n  s: {scope: mesh, retain: \"7\", accepts: [send]}\n",
			manifest.CodeRetain, "seats.s.retain", "7", "retain: 7d"},

		// Issue 37: a seat's backlog is what its queue reserves of the node's store.
		{"backlog in words", head + "seats:\n  s: {scope: mesh, retain: 1d, backlog: lots, accepts: [send]}\n",
			manifest.CodeBacklog, "seats.s.backlog", "lots", "backlog: 64MiB"},
		{"backlog smaller than a job", head + "seats:\n  s: {scope: mesh, retain: 1d, backlog: 64KiB, accepts: [send]}\n",
			manifest.CodeBacklog, "seats.s.backlog", "64KiB", "backlog: 64MiB"},
		{"backlog past the bound", head + "seats:\n  s: {scope: mesh, retain: 1d, backlog: 2TiB, accepts: [send]}\n",
			manifest.CodeBacklog, "seats.s.backlog", "2TiB", "backlog: 64MiB"},
		{"fractional backlog", head + "seats:\n  s: {scope: mesh, retain: 1d, backlog: 1.5GiB, accepts: [send]}\n",
			manifest.CodeBacklog, "seats.s.backlog", "1.5GiB", "backlog: 64MiB"},
		{"backlog without a queue", head + "seats:\n  s: {scope: mesh, backlog: 64MiB, serves: [status]}\n",
			manifest.CodeBacklog, "seats.s.backlog", "64MiB", "remove backlog:"},

		// A module's own events it consumes must be among its emits (its emitter is present).
		{"own event not emitted", head + "emits: [y]\nconsumes: [m.x]\n",
			manifest.CodeNotEmitted, "consumes[0]", "m.x", "write m.y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := manifest.Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			rs := refusals(t, m.Validate())
			if len(rs) != 1 {
				t.Fatalf("got %d refusals, want 1:\n%v", len(rs), rs)
			}
			r := rs[0]
			if r.Code != tc.code || r.Field != tc.field || r.Value != tc.value {
				t.Fatalf("refusal %+v, want code %s, field %q, value %q", r, tc.code, tc.field, tc.value)
			}
			if !strings.Contains(r.Instead, tc.instead) {
				t.Fatalf("Instead=%q, want it to say %q", r.Instead, tc.instead)
			}
			if r.Line == 0 && tc.field != "module" && tc.field != "requires" {
				t.Fatalf("no line: %+v", r)
			}
		})
	}
}

func TestManifest_Validate_Accepted(t *testing.T) {
	for _, tc := range []struct{ name, yaml string }{
		{"the issue's example", `
module: telegram
requires: [mesh-bus]
emits: [message.received]
consumes: [billing.order.placed, "*.download.completed", "builder.**"]
tools: [status]
uses: [mailer]
secrets: [bot-token]
build: {from: bots/telegram, run: go build -o "$OUT" ., on: [base-image]}
seats:
  telegram-sender:
    scope: mesh
    retain: 7d
    accepts: [send]
    emits: [delivered, failed]
    serves: [status]
`},
		{"a provision without the bus", "module: m\nrequires: [postgres]\nsecrets: [db-password]\n"},
		{"nothing but a name", "module: m\n"},
		{"every event", head + "consumes: [\"**\"]\n"},
		{"every module event", head + "consumes: [\"*.**\"]\n"},
		{"covered patterns", head + "consumes: [\"**\", billing.order.placed, \"billing.**\"]\n"},
		{"a seat that only serves", head + "seats:\n  s: {scope: node, serves: [status]}\n"},
		{"retain forms", head + "seats:\n  a: {scope: mesh, retain: 1d12h, accepts: [x]}\n  b: {scope: mesh, retain: 90m, accepts: [x]}\n"},
		{"uses a mesh seat", head + "uses: [mesh-controller]\n"},
		{"uses its own seat", head + "uses: [s]\nseats:\n  s: {scope: node, retain: 1h, accepts: [x]}\n"},
		{"own events consumed", head + "emits: [a.b]\nconsumes: [m.a.*]\n"},
		{"dotted secret", head + "secrets: [stripe.api-key]\n"},
		{"a name of 64", "module: " + strings.Repeat("a", 64) + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := manifest.Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if err := m.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

// TestManifest_Validate_All: every refusal comes back at once, in file order, with lines.
func TestManifest_Validate_All(t *testing.T) {
	m, err := manifest.Parse([]byte(`module: Shop
emits: [order.*, mesh.mod.shop.event.x]
consumes: ["billing.#", ok.event]
seats:
  mesh-cart:
    scope: everywhere
    accepts: [add]
`))
	if err != nil {
		t.Fatal(err)
	}
	rs := refusals(t, m.Validate())
	var got []string
	for _, r := range rs {
		got = append(got, string(r.Code)+"@"+r.Field)
	}
	want := []string{
		"no-bus@requires", // a missing key has no line: the whole-file problem comes first
		"name@module",
		"wildcard-emit@emits[0]",
		"subject@emits[1]",
		"subject@consumes[0]",
		"reserved@seats.mesh-cart",
		"scope@seats.mesh-cart.scope",
		"retain@seats.mesh-cart.retain",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("refusals\n%s\nwant\n%s\n%v", strings.Join(got, "\n"), strings.Join(want, "\n"), rs)
	}
	for i, want := range []int{0, 1, 2, 2, 3, 5, 6, 5} {
		if rs[i].Line != want {
			t.Errorf("%s: Line=%d, want %d", got[i], rs[i].Line, want)
		}
	}
}

func TestParseRetain(t *testing.T) {
	for in, want := range map[string]string{
		"7d": "168h0m0s", "12h": "12h0m0s", "30m": "30m0s", "1d12h": "36h0m0s", "90s": "1m30s",
	} {
		d, err := manifest.ParseRetain(in)
		if err != nil || d.String() != want {
			t.Errorf("ParseRetain(%q)=%v, %v; want %s", in, d, err, want)
		}
	}
	for _, in := range []string{"", "0", "0d", "0s", "-1h", "7", "d", "1.5d", "7days", "7D", "+1h", "1d-1h", "99999999d", "1e9h"} {
		if d, err := manifest.ParseRetain(in); err == nil {
			t.Errorf("ParseRetain(%q)=%v, want an error", in, d)
		}
	}
}
