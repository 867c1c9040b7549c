package manifest_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

func TestParse(t *testing.T) {
	m := mustParse(t, `
module: telegram
requires: [mesh-bus]
emits: [message.received]
consumes: [billing.order.placed, "*.download.completed", "builder.**"]
tools: [status]
uses: [mailer]
secrets: [bot-token]
build: {from: bots/telegram, run: go build -o "$OUT" ., on: [base-image]}
seats:
  zz-last:
    scope: node
  telegram-sender:
    scope: mesh
    retain: 7d
    accepts: [send]
    emits: [delivered, failed]
    serves: [status]
`)
	if got, want := m.Module, "telegram"; got != want {
		t.Fatalf("Module=%q, want %q", got, want)
	}
	if got, want := m.Consumes, []string{"billing.order.placed", "*.download.completed", "builder.**"}; !slices.Equal(got, want) {
		t.Fatalf("Consumes=%q, want %q", got, want)
	}
	if got, want := m.BuildOn, []string{"base-image"}; !slices.Equal(got, want) {
		t.Fatalf("BuildOn=%q, want %q", got, want)
	}
	if got, want := len(m.Seats), 2; got != want {
		t.Fatalf("len(Seats)=%d, want %d", got, want)
	}
	if got, want := m.Seats[0].Name, "telegram-sender"; got != want {
		t.Fatalf("Seats[0].Name=%q, want %q (seats are sorted by name)", got, want)
	}
	s, ok := m.Seat("telegram-sender")
	if !ok {
		t.Fatal("Seat(telegram-sender) not found")
	}
	if s.Scope != manifest.ScopeMesh || s.Retain != "7d" || !slices.Equal(s.Emits, []string{"delivered", "failed"}) {
		t.Fatalf("Seat=%+v", s)
	}
}

// TestParse_Refused covers what strict decoding refuses before any name is looked at: each
// case names its field and line.
func TestParse_Refused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		yaml    string
		code    manifest.Code
		field   string
		value   string
		line    int
		instead string
	}{
		{"unknown top-level key", "module: a\nrequires: [mesh-bus]\nemit: [x]\n",
			manifest.CodeUnknownKey, "emit", "emit", 3, "write emits"},
		{"unknown seat key", "module: a\nrequires: [mesh-bus]\nseats:\n  s:\n    scope: mesh\n    retian: 7d\n",
			manifest.CodeUnknownKey, "seats.s.retian", "retian", 6, "write retain"},
		{"unknown build key", "module: a\nbuild:\n  form: b\n",
			manifest.CodeUnknownKey, "build.form", "form", 3, "write from"},
		{"duplicate key", "module: a\nrequires: [mesh-bus]\nemits: [x]\nemits: [y]\n",
			manifest.CodeDuplicate, "emits", "emits", 4, "merge"},
		{"duplicate seat", "module: a\nrequires: [mesh-bus]\nseats:\n  s: {scope: mesh}\n  s: {scope: node}\n",
			manifest.CodeDuplicate, "seats.s", "s", 5, "merge"},
		{"scalar for a list", "module: a\nrequires: [mesh-bus]\nemits: order.placed\n",
			manifest.CodeShape, "emits", "order.placed", 3, "write emits: [order.placed]"},
		{"list for a name", "module: [a, b]\n",
			manifest.CodeShape, "module", "", 1, "write module: <name>"},
		{"seat not a mapping", "module: a\nrequires: [mesh-bus]\nseats:\n  s: [send]\n",
			manifest.CodeShape, "seats.s", "", 4, "scope: mesh"},
		{"seats a list", "module: a\nrequires: [mesh-bus]\nseats: [s]\n",
			manifest.CodeShape, "seats", "", 3, "write seats:"},
		{"not a mapping", "- module: a\n",
			manifest.CodeShape, "", "", 1, "module: <name>"},
		{"empty", "",
			manifest.CodeYAML, "", "", 0, "module: <name>"},
		{"two documents", "module: a\n---\nmodule: b\n",
			manifest.CodeYAML, "", "", 2, "one manifest per file"},
		{"syntax", "module: a\nemits: [x\n",
			manifest.CodeYAML, "", "", 0, "fix the YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := manifest.Parse([]byte(tc.yaml))
			rs := refusals(t, err)
			if len(rs) == 0 {
				t.Fatal("Parse accepted it")
			}
			r := rs[0]
			if r.Code != tc.code || r.Field != tc.field || r.Value != tc.value || !strings.Contains(r.Instead, tc.instead) {
				t.Fatalf("refusal %+v, want code %s field %q value %q instead ~%q", r, tc.code, tc.field, tc.value, tc.instead)
			}
			if tc.line != 0 && r.Line != tc.line {
				t.Fatalf("Line=%d, want %d (%v)", r.Line, tc.line, r)
			}
		})
	}
}

// TestParse_AllUnknownKeys: every unknown key is reported at once, not the first only.
func TestParse_AllUnknownKeys(t *testing.T) {
	_, err := manifest.Parse([]byte("module: a\nemmits: [x]\nconsume: [b.c]\nseats:\n  s: {scope: mesh, acepts: [x]}\n"))
	rs := refusals(t, err)
	var fields []string
	for _, r := range rs {
		fields = append(fields, r.Field)
	}
	if want := []string{"emmits", "consume", "seats.s.acepts"}; !slices.Equal(fields, want) {
		t.Fatalf("fields=%q, want %q", fields, want)
	}
	if !strings.Contains(rs[0].Instead, "write emits") || !strings.Contains(rs[2].Instead, "write accepts") {
		t.Fatalf("no did-you-mean: %v", rs)
	}
}

func TestRefusal_Error(t *testing.T) {
	r := manifest.Refusal{Field: "consumes[0]", Value: "mesh.mod.billing.event.order.placed", Reason: "is a subject", Instead: "write billing.order.placed"}
	if got, want := r.Error(), `consumes[0] "mesh.mod.billing.event.order.placed": is a subject; write billing.order.placed`; got != want {
		t.Fatalf("Error()=%q, want %q", got, want)
	}
	r = manifest.Refusal{Field: "module", Reason: "is missing", Instead: "write module: <name>"}
	if got, want := r.Error(), `module: is missing; write module: <name>`; got != want {
		t.Fatalf("Error()=%q, want %q", got, want)
	}
}
