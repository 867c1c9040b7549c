package manifest_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// versionedMailer serves v1 and a v2 whose send requires a field v1's does not.
const versionedMailer = `module: mail
requires: [mesh-bus]
seats:
  mailer:
    scope: mesh
    retain: 1d
    accepts: [send]
    serves: [status]
    emits: [delivered]
    versions:
      v2:
        accepts: [send]
        serves: [status]
        emits: [delivered, bounced]
        shapes:
          send: {type: object, required: [to, subject]}
`

// TestVersions_Derive: a later version lives on mesh.seat.<seat>.<version>.…; the seat's work
// queue and its holder's consumer take both versions' work; the holder may answer and emit
// both; a user speaks only the version it is pinned to.
func TestVersions_Derive(t *testing.T) {
	d := mustDerive(t, versionedMailer)
	sd := d.Seats[0]
	var accepts, emits, serves []string
	for _, a := range sd.Accepts {
		accepts = append(accepts, a.Subject)
	}
	for _, e := range sd.Emits {
		emits = append(emits, e.Subject)
	}
	for _, s := range sd.Serves {
		serves = append(serves, s.Subject)
	}
	if want := []string{"mesh.seat.mailer.accept.send", "mesh.seat.mailer.v2.accept.send"}; !slices.Equal(accepts, want) {
		t.Errorf("accepts %v, want %v", accepts, want)
	}
	if want := []string{"mesh.seat.mailer.event.delivered", "mesh.seat.mailer.v2.event.delivered", "mesh.seat.mailer.v2.event.bounced"}; !slices.Equal(emits, want) {
		t.Errorf("emits %v, want %v", emits, want)
	}
	if want := []string{"mesh.seat.mailer.tool.status", "mesh.seat.mailer.v2.tool.status"}; !slices.Equal(serves, want) {
		t.Errorf("serves %v, want %v", serves, want)
	}
	if want := []string{"mesh.seat.mailer.accept.>", "mesh.seat.mailer.v2.accept.>"}; !slices.Equal(sd.Stream.Subjects, want) || !slices.Equal(sd.Consumer.FilterSubjects, want) {
		t.Errorf("stream %v, consumer %v, want both %v", sd.Stream.Subjects, sd.Consumer.FilterSubjects, want)
	}
	for _, want := range []string{"mesh.seat.mailer.v2.event.bounced", "mesh.seat.mailer.event.delivered"} {
		if !slices.Contains(sd.Holder.Publish, manifest.AdmitSubject("mail", want)) {
			t.Errorf("holder may not publish %s: %v", want, sd.Holder.Publish)
		}
	}
	if !slices.Contains(sd.Holder.Subscribe, manifest.Subscription{Subject: "mesh.seat.mailer.v2.tool.status", Queue: "mailer"}) {
		t.Errorf("holder may not answer v2's status: %v", sd.Holder.Subscribe)
	}

	// Every event EVENTS captures, of any version: a stream whose subjects miss one would
	// leave a holder's emit without a stream.
	for _, e := range emits {
		if !slices.ContainsFunc(manifest.EventsStream().Subjects, func(p string) bool { return manifest.Matches(p, e) }) {
			t.Errorf("EVENTS does not capture %s", e)
		}
	}

	user := mustParse(t, head+"uses: [mailer]\nconsumes: [seat.mailer.delivered]\n")
	v1, err := user.DeriveWith(nil)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := user.DeriveWith(map[string]string{"mailer": "v2"})
	if err != nil {
		t.Fatal(err)
	}
	if v1.Uses[0].Version != "v1" || !slices.Contains(v1.Permissions.Publish, "mesh.admit.m.mesh.seat.mailer.accept.>") ||
		slices.Contains(v1.Permissions.Publish, "mesh.admit.m.mesh.seat.mailer.v2.accept.>") {
		t.Errorf("v1 user: %+v publish %v", v1.Uses[0], v1.Permissions.Publish)
	}
	if v2.Uses[0].Version != "v2" || !slices.Contains(v2.Permissions.Publish, "mesh.admit.m.mesh.seat.mailer.v2.accept.>") ||
		!slices.Contains(v2.Permissions.Publish, "mesh.seat.mailer.v2.tool.>") || slices.Contains(v2.Permissions.Publish, "mesh.admit.m.mesh.seat.mailer.accept.>") {
		t.Errorf("v2 user: %+v publish %v", v2.Uses[0], v2.Permissions.Publish)
	}
	if got := v2.EventsConsumer.FilterSubjects[0]; got != "mesh.seat.mailer.v2.event.delivered" {
		t.Errorf("a v2 consumer of seat.mailer.delivered filters %s", got)
	}
	if len(v2.Pins) != 1 || v2.Pins["mailer"] != "v2" {
		t.Errorf("pins %v", v2.Pins)
	}
	if d, _ := user.DeriveWith(map[string]string{"mailer": "v1"}); d.Pins != nil {
		t.Errorf("a v1 pin is kept as %v; v1 is no pin", d.Pins)
	}
	for _, pins := range []map[string]string{{"other": "v2"}, {"mailer": "v10"}, {"mailer": "2"}} {
		if _, err := user.DeriveWith(pins); !errors.Is(err, manifest.ErrPin) {
			t.Errorf("pins %v: %v, want ErrPin", pins, err)
		}
	}
}

// TestVersions_Validate: versions are v2 … v9, checked like v1, and not for the mesh's seats;
// a seat's fingerprint changes with a version, and not without one.
func TestVersions_Validate(t *testing.T) {
	for _, tc := range []struct{ name, yaml, field string }{
		{"v1 is the seat's own", strings.Replace(versionedMailer, "v2:", "v1:", 1), "seats.mailer.versions.v1"},
		{"v10 is past the bound", strings.Replace(versionedMailer, "v2:", "v10:", 1), "seats.mailer.versions.v10"},
		{"a bad verb", strings.Replace(versionedMailer, "accepts: [send]\n        serves", "accepts: [Send]\n        serves", 1), "seats.mailer.versions.v2.accepts[0]"},
		{"a shape of nothing", strings.Replace(versionedMailer, "          send: {", "          post: {", 1), "seats.mailer.versions.v2.shapes.post"},
		{"the mesh's seats have one version", "module: gitter\nrequires: [mesh-bus]\nseats:\n  mesh-git:\n    scope: mesh\n    emits: [pushed]\n    serves: [archive]\n    versions: {v2: {serves: [archive]}}\n", "seats.mesh-git.versions.v2"},
	} {
		m, err := manifest.Parse([]byte(tc.yaml))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		rs := refusals(t, m.Validate())
		if !slices.ContainsFunc(rs, func(r manifest.Refusal) bool { return r.Field == tc.field }) {
			t.Errorf("%s: refusals %v, want one at %s", tc.name, rs, tc.field)
		}
	}
	if _, err := manifest.Parse([]byte(strings.Replace(versionedMailer, "        emits: [delivered, bounced]", "        retain: 2d", 1))); err == nil {
		t.Error("a version with its own retain parsed; retain is the seat's")
	}
	// A version that accepts work makes the seat need retain even when v1 accepts none.
	m, err := manifest.Parse([]byte(head + "seats:\n  s:\n    scope: mesh\n    serves: [t]\n    versions: {v2: {accepts: [go]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if rs := refusals(t, m.Validate()); !slices.ContainsFunc(rs, func(r manifest.Refusal) bool { return r.Field == "seats.s.retain" }) {
		t.Errorf("refusals %v, want seats.s.retain", rs)
	}

	plain := seatOf(t, shapedMailer)
	versioned := seatOf(t, versionedMailer)
	withV1Only, _ := versioned.At("v1")
	if manifest.Fingerprint(versioned) == manifest.Fingerprint(withV1Only) {
		t.Error("a version does not change the fingerprint")
	}
	if manifest.Fingerprint(plain) != manifest.Fingerprint(seatOf(t, shapedMailer)) {
		t.Error("the fingerprint is not stable")
	}
	if got := versioned.VersionNames(); !slices.Equal(got, []string{"v1", "v2"}) {
		t.Errorf("VersionNames %v", got)
	}
}

// TestVersions_Bindings: a version nobody is bound to may change (or go); one a module is
// pinned to may not; a consumer of a version's event keeps it emitted.
func TestVersions_Bindings(t *testing.T) {
	s := seatOf(t, versionedMailer)
	v1, _ := s.At("v1")
	v2, _ := s.At("v2")
	onV2 := []manifest.Binding{{Module: "shop", Seat: "mailer", Version: "v2", Uses: true, Protocol: v2.Protocol()}}
	onV1 := []manifest.Binding{{Module: "shop", Seat: "mailer", Version: "v1", Uses: true, Protocol: v1.Protocol()}}

	breakV1 := mustParse(t, strings.Replace(versionedMailer, "    accepts: [send]\n    serves", "    accepts: [post]\n    serves", 1))
	if err := manifest.CheckBindings(breakV1, onV2); err != nil {
		t.Errorf("v1 changed while nobody is bound to it: %v", err)
	}
	if err := manifest.CheckBindings(breakV1, onV1); err == nil || !strings.Contains(err.Error(), "module shop is bound") {
		t.Errorf("v1 broken under a v1 caller: %v", err)
	}
	dropV2 := mustParse(t, versionedMailer[:strings.Index(versionedMailer, "    versions:")])
	if err := manifest.CheckBindings(dropV2, onV2); err == nil || !strings.Contains(err.Error(), "removes protocol version v2") {
		t.Errorf("v2 removed under a v2 caller: %v", err)
	}
	if err := manifest.CheckBindings(dropV2, onV1); err != nil {
		t.Errorf("v2 removed while nobody is bound to it: %v", err)
	}
	breakV2 := mustParse(t, strings.Replace(versionedMailer, "required: [to, subject]", "required: [to, subject, body]", 1))
	if err := manifest.CheckBindings(breakV2, onV2); err == nil || !strings.Contains(err.Error(), "seats.mailer.versions.v2.shapes.send") {
		t.Errorf("v2's shape broken under a v2 caller: %v", err)
	}
	consumer := []manifest.Binding{{Module: "audit-ui", Seat: "mailer", Version: "v2", Events: []string{"bounced"}}}
	noBounce := mustParse(t, strings.Replace(versionedMailer, "emits: [delivered, bounced]", "emits: [delivered]", 1))
	if err := manifest.CheckBindings(noBounce, consumer); err == nil || !strings.Contains(err.Error(), "stops emitting bounced") {
		t.Errorf("v2's event removed under its consumer: %v", err)
	}
}

// TestParseSeatSubject takes every kind of seat subject apart, of v1 and later versions, and
// refuses what is none.
func TestParseSeatSubject(t *testing.T) {
	for subject, want := range map[string]manifest.SeatSubject{
		"mesh.seat.mailer.accept.send":             {Seat: "mailer", Version: "v1", Kind: "accept", Name: "send"},
		"mesh.seat.mailer.v2.accept.send":          {Seat: "mailer", Version: "v2", Kind: "accept", Name: "send"},
		"mesh.seat.mailer.node.a.accept.send":      {Seat: "mailer", Version: "v1", Node: "a", Kind: "accept", Name: "send"},
		"mesh.seat.mailer.v3.node.a.accept.send":   {Seat: "mailer", Version: "v3", Node: "a", Kind: "accept", Name: "send"},
		"mesh.seat.mailer.event.order.sent":        {Seat: "mailer", Version: "v1", Kind: "event", Name: "order.sent"},
		"mesh.seat.mailer.v9.event.sent":           {Seat: "mailer", Version: "v9", Kind: "event", Name: "sent"},
		"mesh.seat.mailer.v2.tool.status":          {Seat: "mailer", Version: "v2", Kind: "tool", Name: "status"},
		"mesh.seat.mesh-vault.tool.fetch.mod.shop": {},
		"mesh.seat.mailer.v10.event.sent":          {},
		"mesh.seat.mailer.node.a.tool.status":      {},
		"mesh.mod.mailer.event.sent":               {},
		"mesh.seat.mailer.accept":                  {},
	} {
		got, ok := manifest.ParseSeatSubject(subject)
		if ok != (want != manifest.SeatSubject{}) || got != want {
			t.Errorf("%s: %+v %v, want %+v", subject, got, ok, want)
		}
	}
	if got := manifest.Unversioned("mesh.seat.mailer.v2.event.sent"); got != "mesh.seat.mailer.event.sent" {
		t.Errorf("Unversioned: %s", got)
	}
	if got := manifest.Unversioned("mesh.mod.v2.event.sent"); got != "mesh.mod.v2.event.sent" {
		t.Errorf("Unversioned of a module's event: %s", got)
	}
}
