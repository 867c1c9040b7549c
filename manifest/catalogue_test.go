package manifest_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// subjectGrammar is what the wire would say, by the test's own reckoning: NATS subjects of
// DESIGN §2 (with or without mesh., versioned or not), the old bus's routing keys and
// wildcards, NATS's >, the JetStream API and inboxes. Comments are part of the bytes: a
// manifest's comment holding a subject is a subject someone will copy. A lone # or > can only
// be a value when quoted; unquoted, # starts a comment.
var subjectGrammar = regexp.MustCompile(`(^|[^a-z0-9-])(mesh|module|node)\.|\.(v[0-9]+\.)?(event|tool|accept)\.|\$JS|_INBOX|\.#|\.>|["'][#>]`)

// TestCatalogue checks testdata/catalogue as design 29 §12 asks: no manifest holds a subject,
// every present emitter emits what is consumed from it, and each module passes the
// catalogue checks against the others.
func TestCatalogue(t *testing.T) {
	raw, ms := loadCatalogue(t)
	if len(ms) < 8 {
		t.Fatalf("the catalogue holds %d modules, want at least 8", len(ms))
	}
	for _, name := range []string{"git", "builder", "registry", "billing", "shop", "mailer", "telegram", "auditor"} {
		if !slices.ContainsFunc(ms, func(m *manifest.Manifest) bool { return m.Module == name }) {
			t.Errorf("the catalogue has no %s", name)
		}
	}

	t.Run("no manifest holds a subject", func(t *testing.T) {
		for file, data := range raw {
			for i, line := range strings.Split(string(data), "\n") {
				if loc := subjectGrammar.FindStringIndex(line); loc != nil {
					t.Errorf("%s:%d holds a subject: %q", file, i+1, line)
				}
			}
		}
	})

	t.Run("every present emitter emits what is consumed from it", func(t *testing.T) {
		byName := map[string]*manifest.Manifest{}
		for _, m := range ms {
			byName[m.Module] = m
		}
		for _, m := range ms {
			d, err := m.Derive()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range d.Consumes {
				emitter, _, _ := strings.Cut(c.Name, ".")
				e, ok := byName[emitter]
				if !ok {
					continue
				}
				if !slices.ContainsFunc(e.Emits, func(ev string) bool { return match(c.Subject, manifest.EventSubject(emitter, ev)) }) {
					t.Errorf("%s consumes %s, but %s emits only %q", m.Module, c.Name, emitter, e.Emits)
				}
			}
		}
	})

	t.Run("each module passes against the others", func(t *testing.T) {
		for _, m := range ms {
			if err := manifest.CheckCatalogue(m, without(ms, m.Module), m); err != nil {
				t.Errorf("%s: %v", m.Module, err)
			}
		}
	})

	t.Run("the grammar catches what it must", func(t *testing.T) {
		for _, line := range []string{
			"consumes: [mesh.mod.billing.event.order.placed]",
			"consumes: [billing.event.order.placed]",
			"consumes: [module.billing.order.placed]",
			"uses: [mesh.seat.mailer.v2.accept.send]",
			`consumes: ["#"]`, `consumes: ["billing.#"]`, `consumes: [">"]`, "consumes: [billing.>]",
			"consumes: [node.n1.joined]", "secrets: [$JS.API.INFO]", "consumes: [_INBOX.x]",
		} {
			if !subjectGrammar.MatchString(line) {
				t.Errorf("the test's grammar misses %q", line)
			}
		}
		for _, line := range []string{"requires: [mesh-bus]", "module: node-exporter", "# a comment", `consumes: ["**"]`} {
			if subjectGrammar.MatchString(line) {
				t.Errorf("the test's grammar flags %q", line)
			}
		}
	})
}

// TestCheckCatalogue covers rule 6, each refusal naming the module it conflicts with.
func TestCheckCatalogue(t *testing.T) {
	_, catalogue := loadCatalogue(t)
	for _, tc := range []struct {
		name     string
		yaml     string
		previous string // the registered version of the module, or ""
		code     manifest.Code
		field    string
		value    string
		says     string // in Reason
		instead  string
	}{
		{name: "a seat another module declares",
			yaml: "module: postman\nrequires: [mesh-bus]\nseats:\n  mailer: {scope: mesh, retain: 1d, accepts: [send]}\n",
			code: manifest.CodeSeatTaken, field: "seats.mailer", value: "mailer", says: "module mailer", instead: "uses: [mailer]"},
		{name: "an event its emitter does not emit",
			yaml: head + "consumes: [billing.order.shipped]\n",
			code: manifest.CodeNotEmitted, field: "consumes[0]", value: "billing.order.shipped",
			says: "it emits order.placed, order.paid, order.refunded, invoice.issued", instead: "write one of billing.order.placed"},
		{name: "a pattern matching none of its emitter's events",
			yaml: head + "consumes: [\"git.release.*\"]\n",
			code: manifest.CodeNotEmitted, field: "consumes[0]", value: "git.release.*", says: "git does not emit it", instead: "git.pushed"},
		{name: "an emitter that emits nothing",
			yaml: head + "consumes: [\"base-image.**\"]\n",
			code: manifest.CodeNotEmitted, field: "consumes[0]", value: "base-image.**", says: "base-image emits no events", instead: "remove it"},
		{name: "an emitter without an event consumed from it",
			yaml: "module: billing\nrequires: [mesh-bus]\nemits: [order.placed, order.paid]\n", previous: "billing.yaml",
			code: manifest.CodeNotEmitted, field: "emits", value: "order.placed, order.paid", says: "module shop consumes billing.order.refunded", instead: "emit order.refunded"},
		{name: "an accept removed from a used seat",
			yaml:     "module: mailer\nrequires: [mesh-bus]\nemits: [bounce.received]\nseats:\n  mailer: {scope: mesh, retain: 7d, accepts: [deliver, send-bulk], serves: [status, quota]}\n",
			previous: "mailer.yaml",
			code:     manifest.CodeBreaking, field: "seats.mailer.accepts", value: "send", says: "modules billing, shop, telegram use", instead: "keep accept send"},
		{name: "a serve removed from a used seat",
			yaml:     "module: mailer\nrequires: [mesh-bus]\nemits: [bounce.received]\nseats:\n  mailer: {scope: mesh, retain: 7d, accepts: [send, send-bulk], serves: [status]}\n",
			previous: "mailer.yaml",
			code:     manifest.CodeBreaking, field: "seats.mailer.serves", value: "quota", says: "modules billing, shop, telegram use", instead: "keep serve quota"},
		{name: "a used seat removed",
			yaml:     "module: registry\nrequires: [mesh-bus]\nemits: [image.pushed, image.deleted]\n",
			previous: "registry.yaml",
			code:     manifest.CodeBreaking, field: "seats", value: "registry-index", says: "modules builder, release use", instead: "keep declaring registry-index"},
		{name: "a used seat moved to node scope",
			yaml:     "module: registry\nrequires: [mesh-bus]\nemits: [image.pushed, image.deleted]\nseats:\n  registry-index: {scope: node, retain: 3d, accepts: [index, prune], emits: [indexed], serves: [lookup]}\n",
			previous: "registry.yaml",
			code:     manifest.CodeBreaking, field: "seats.registry-index.scope", value: "node", says: "from mesh to node scope", instead: "keep scope: mesh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := manifest.Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}
			var previous *manifest.Manifest
			if tc.previous != "" {
				previous = byModule(catalogue, strings.TrimSuffix(tc.previous, ".yaml"))
			}
			rs := refusals(t, manifest.CheckCatalogue(m, catalogue, previous))
			if len(rs) != 1 {
				t.Fatalf("got %d refusals, want 1:\n%v", len(rs), rs)
			}
			r := rs[0]
			if r.Code != tc.code || r.Field != tc.field || r.Value != tc.value {
				t.Fatalf("refusal %+v, want code %s, field %q, value %q", r, tc.code, tc.field, tc.value)
			}
			if !strings.Contains(r.Reason, tc.says) || !strings.Contains(r.Instead, tc.instead) {
				t.Fatalf("refusal %q, want it to say %q and %q", r.Error(), tc.says, tc.instead)
			}
		})
	}
}

func TestCheckCatalogue_Accepted(t *testing.T) {
	_, catalogue := loadCatalogue(t)
	for _, tc := range []struct{ name, yaml, previous string }{
		{"an absent emitter", head + "consumes: [payroll.salary.paid]\n", ""},
		{"a wildcard emitter", head + "consumes: [\"*.nothing.emits.this\"]\n", ""},
		{"a wildcard event its emitter matches", head + "consumes: [\"billing.order.*\", \"git.**\"]\n", ""},
		{"additive seat changes", "module: mailer\nrequires: [mesh-bus]\nemits: [bounce.received]\nseats:\n  mailer: {scope: mesh, retain: 1d, accepts: [send, send-bulk, send-later], emits: [delivered], serves: [status, quota, stats]}\n", "mailer"},
		{"a seat nobody uses changes", "module: telegram\nrequires: [mesh-bus]\nemits: [message.received]\nseats:\n  telegram-sender: {scope: node, retain: 1d, accepts: [deliver]}\n", "telegram"},
		{"an unused seat removed", "module: git\nrequires: [mesh-bus]\nemits: [pushed, tag.created]\n", "git"},
		{"a new module", head + "uses: [mailer, nobody-declares-this]\nseats:\n  fresh: {scope: mesh}\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustParse(t, tc.yaml)
			var previous *manifest.Manifest
			if tc.previous != "" {
				previous = byModule(catalogue, tc.previous)
			}
			if err := manifest.CheckCatalogue(m, catalogue, previous); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}
}

func byModule(ms []*manifest.Manifest, module string) *manifest.Manifest {
	for _, m := range ms {
		if m.Module == module {
			return m
		}
	}
	return nil
}

func TestFingerprint(t *testing.T) {
	base := manifest.Seat{Name: "s", Scope: manifest.ScopeMesh, Retain: "7d", Accepts: []string{"a", "b"}, Emits: []string{"e"}, Serves: []string{"t"}}
	fp := manifest.Fingerprint(base)
	if len(fp) != 64 || strings.Trim(fp, "0123456789abcdef") != "" {
		t.Fatalf("Fingerprint=%q, want 64 hex digits", fp)
	}
	same := base
	same.Accepts = []string{"b", "a"}
	same.Retain = "1d"
	if got := manifest.Fingerprint(same); got != fp {
		t.Fatal("the fingerprint depends on declaration order or retain")
	}
	for name, change := range map[string]func(*manifest.Seat){
		"accept added":      func(s *manifest.Seat) { s.Accepts = append(s.Accepts, "c") },
		"accept renamed":    func(s *manifest.Seat) { s.Accepts = []string{"a", "c"} },
		"serve removed":     func(s *manifest.Seat) { s.Serves = nil },
		"emit added":        func(s *manifest.Seat) { s.Emits = append(s.Emits, "f") },
		"scope changed":     func(s *manifest.Seat) { s.Scope = manifest.ScopeNode },
		"verb changes kind": func(s *manifest.Seat) { s.Accepts, s.Serves = []string{"a", "b", "t"}, nil },
	} {
		s := base
		s.Accepts, s.Emits, s.Serves = slices.Clone(base.Accepts), slices.Clone(base.Emits), slices.Clone(base.Serves)
		change(&s)
		if manifest.Fingerprint(s) == fp {
			t.Errorf("%s: the fingerprint did not change", name)
		}
	}
}

// TestCheck: one call reports the refusals of every stage, and a catalogue entry for the same
// module is its previous version.
func TestCheck(t *testing.T) {
	_, catalogue := loadCatalogue(t)
	m, err := manifest.Check([]byte(`module: mailer
requires: [mesh-bus]
emit: [bounce.received]
consumes: [billing.order.shipped]
seats:
  mailer: {scope: mesh, retain: 7 days, accepts: [send-bulk], serves: [status, quota]}
`), catalogue)
	if m == nil || m.Module != "mailer" {
		t.Fatalf("Check returned no manifest for a file with an unknown key: %v", m)
	}
	var got []string
	for _, r := range refusals(t, err) {
		got = append(got, string(r.Code)+"@"+r.Field)
	}
	want := []string{
		"unknown-key@emit",
		"not-emitted@consumes[0]",
		"retain@seats.mailer.retain",
		"breaking@seats.mailer.accepts",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("refusals %q, want %q\n%v", got, want, err)
	}

	if m, err := manifest.Check([]byte("module: a\nmodule: b\n"), nil); m != nil || len(refusals(t, err)) != 1 {
		t.Fatalf("a duplicate key: m=%v, err=%v; want no manifest and one refusal", m, err)
	}
	if _, err := manifest.Check(mustRead(t, "testdata/catalogue/mailer.yaml"), catalogue); err != nil {
		t.Fatalf("a registered manifest against the catalogue holding it: %v", err)
	}
}

func mustRead(tb testing.TB, path string) []byte {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// TestCheckCatalogue_SeatEvents: consumes: seat.<seat>.<event> names a seat's events; a
// declared seat (by another module, or the mesh's own) must emit what the pattern matches,
// and an undeclared one may come later.
func TestCheckCatalogue_SeatEvents(t *testing.T) {
	mailer := mustParse(t, "module: mail\nrequires: [mesh-bus]\nseats:\n  mailer:\n    scope: mesh\n    emits: [delivered, bounced]\n")
	for _, tc := range []struct {
		consumes string
		refused  string // "" when accepted; else what the refusal's Instead says
	}{
		{"seat.mailer.delivered", ""},
		{"seat.mailer.**", ""},
		{"seat.*.delivered", ""},
		{"seat.**", ""},
		{"seat.fax.sent", ""},
		{"seat.mesh-vault.rotated", ""},
		{"seat.mailer.opened", "seat.mailer.delivered"},
		{"seat.mesh-git.pulled", "seat.mesh-git.pushed"},
	} {
		m := mustParse(t, "module: shop\nrequires: [mesh-bus]\nconsumes: ["+tc.consumes+"]\n")
		err := manifest.CheckCatalogue(m, []*manifest.Manifest{mailer}, nil)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("consumes %s: %v", tc.consumes, err)
		case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("consumes %s: %v, want a refusal suggesting %s", tc.consumes, err, tc.refused)
		}
	}
	if _, err := manifest.ConsumeSubject("seat.mailer"); err == nil {
		t.Error("seat.mailer names no event, yet derives a subject")
	}
	if s, _ := manifest.ConsumeSubject("seat.mailer.delivered"); s != "mesh.seat.mailer.event.delivered" {
		t.Errorf("seat.mailer.delivered derives %q", s)
	}
	if s, _ := manifest.ConsumeSubject("seat.**"); s != "mesh.seat.*.event.>" {
		t.Errorf("seat.** derives %q", s)
	}
}

// TestCheckCatalogue_SeatEventConsumed: a declarer that stops emitting an event some module
// consumes by the seat's name is refused, naming the consumer.
func TestCheckCatalogue_SeatEventConsumed(t *testing.T) {
	watcher := mustParse(t, "module: watcher\nrequires: [mesh-bus]\nconsumes: [seat.mailer.delivered]\n")
	m := mustParse(t, "module: mail\nrequires: [mesh-bus]\nseats:\n  mailer:\n    scope: mesh\n    emits: [bounced]\n")
	err := manifest.CheckCatalogue(m, []*manifest.Manifest{watcher}, nil)
	if err == nil || !strings.Contains(err.Error(), "module watcher consumes seat.mailer.delivered") {
		t.Fatalf("dropping a consumed seat event: %v, want a refusal naming watcher", err)
	}
	m = mustParse(t, "module: mail\nrequires: [mesh-bus]\nseats:\n  mailer:\n    scope: mesh\n    emits: [bounced, delivered]\n")
	if err := manifest.CheckCatalogue(m, []*manifest.Manifest{watcher}, nil); err != nil {
		t.Fatalf("a declarer emitting the consumed event: %v", err)
	}
}
