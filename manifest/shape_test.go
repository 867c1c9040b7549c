package manifest_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

const shapedMailer = `module: mail
requires: [mesh-bus]
seats:
  mailer:
    scope: mesh
    retain: 1d
    accepts: [send]
    serves: [status]
    emits: [delivered]
    shapes:
      send:
        type: object
        required: [to]
        properties:
          to: {type: string}
          subject: {type: string}
          priority: {type: string, enum: [low, high]}
          copies: {type: integer}
`

// seatOf parses yaml and returns its one seat.
func seatOf(t *testing.T, yaml string) manifest.Seat {
	t.Helper()
	m := mustParse(t, yaml)
	if err := m.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	return m.Seats[0]
}

// TestShape_Check: a payload fits its declared shape or is refused naming the field.
func TestShape_Check(t *testing.T) {
	shape := seatOf(t, shapedMailer).Shapes["send"]
	for payload, want := range map[string]string{
		`{"to":"a@b"}`:                     "",
		`{"to":"a@b","priority":"high"}`:   "",
		`{"to":"a@b","copies":2,"x":true}`: "",
		`{"subject":"hi"}`:                 "lacks required field to",
		`{"to":7}`:                         "payload.to: is a number, not string",
		`{"to":"a@b","priority":"urgent"}`: "not one of",
		`{"to":"a@b","copies":1.5}`:        "not integer",
		`["to"]`:                           "is an array, not object",
	} {
		var v any
		if err := json.Unmarshal([]byte(payload), &v); err != nil {
			t.Fatal(err)
		}
		err := shape.Check(v)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", payload, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want an error saying %q", payload, err, want)
		}
	}
}

// TestShape_Declarations: a shape must name a verb, tool or event of its seat and be a
// well-formed subset of JSON Schema.
func TestShape_Declarations(t *testing.T) {
	for _, tc := range []struct{ shapes, want string }{
		{"      fax: {type: object}\n", "names no verb, tool or event"},
		{"      send: {type: text}\n", `type "text": is not one of`},
		{"      send: {type: string, required: [to]}\n", "describe an object"},
		{"      send: {type: object, required: [to], properties: {subject: {type: string}}}\n", `required "to": is not one of its properties`},
		{"      send: {type: object, pattern: x}\n", "pattern"},
	} {
		m, err := manifest.Parse([]byte("module: mail\nrequires: [mesh-bus]\nseats:\n  mailer:\n    scope: mesh\n    retain: 1d\n    accepts: [send]\n    shapes:\n" + tc.shapes))
		if err == nil {
			err = m.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("shapes %q: %v, want a refusal saying %q", tc.shapes, err, tc.want)
		}
	}
}

// TestProtocol_Breaks: a new required field, a removed field, a narrowed type or enum and a
// removed verb break a bound caller; a new optional field, a widened enum, a new verb and
// a shape added where there was none do not.
func TestProtocol_Breaks(t *testing.T) {
	old := seatOf(t, shapedMailer).Protocol()
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"new required field", "required: [to]", "required: [to, subject]", "makes subject a required field"},
		{"removed field", "          subject: {type: string}\n", "", "removes field subject"},
		{"narrowed type", "copies: {type: integer}", "copies: {type: string}", "changes type integer to string"},
		{"narrowed enum", "enum: [low, high]", "enum: [high]", "removes the value low"},
		{"removed verb", "accepts: [send]", "accepts: [post]", "removes or renames accept send"},
		{"removed tool", "serves: [status]", "serves: []", "removes or renames serve status"},
		{"additive: optional field", "          copies: {type: integer}\n", "          copies: {type: integer}\n          bcc: {type: string}\n", ""},
		{"additive: widened enum", "enum: [low, high]", "enum: [low, high, urgent]", ""},
		{"additive: new verb", "accepts: [send]", "accepts: [send, cancel]", ""},
		{"additive: integer to number", "copies: {type: integer}", "copies: {type: number}", ""},
	} {
		next := strings.Replace(shapedMailer, tc.from, tc.to, 1)
		if next == shapedMailer {
			t.Fatalf("%s: the replacement changed nothing", tc.name)
		}
		m, err := manifest.Parse([]byte(next)) // unvalidated: a removed verb leaves its shape behind
		if err != nil {
			t.Fatal(err)
		}
		s, _ := m.Seat("mailer")
		var got []string
		for _, b := range old.Breaks(s.Protocol()) {
			got = append(got, b.Reason)
		}
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("%s: breaks %v", tc.name, got)
		case tc.want != "" && !strings.Contains(strings.Join(got, "; "), tc.want):
			t.Errorf("%s: breaks %v, want %q", tc.name, got, tc.want)
		}
	}
}

// TestCheckBindings_NamesTheBound: a declaration that breaks the protocol modules are bound
// to is refused naming them, whoever declares it.
func TestCheckBindings_NamesTheBound(t *testing.T) {
	bound := seatOf(t, shapedMailer).Protocol()
	other := mustParse(t, strings.Replace(strings.Replace(shapedMailer, "module: mail", "module: postman", 1), "required: [to]", "required: [to, subject]", 1))
	err := manifest.CheckBindings(other, []manifest.Binding{
		{Module: "shop", Seat: "mailer", Uses: true, Protocol: bound},
		{Module: "billing", Seat: "mailer", Uses: true, Protocol: bound},
	})
	if err == nil || !strings.Contains(err.Error(), "modules billing, shop are bound") || !strings.Contains(err.Error(), "makes subject a required field") {
		t.Fatalf("a breaking redeclaration: %v, want a refusal naming billing and shop", err)
	}
	additive := mustParse(t, strings.Replace(shapedMailer, "accepts: [send]", "accepts: [send, cancel]", 1))
	if err := manifest.CheckBindings(additive, []manifest.Binding{{Module: "shop", Seat: "mailer", Uses: true, Protocol: bound}}); err != nil {
		t.Fatalf("an additive redeclaration: %v", err)
	}
}
