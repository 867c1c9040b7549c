package main

import (
	"strings"
	"testing"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
)

// TestOperatorToolSubject: the operator's call reaches a module's tool, or a seat's — the
// README's mailer declares a seat of its own name, whose tools the module does not declare.
func TestOperatorToolSubject(t *testing.T) {
	mailer := `module: mailer
requires: [mesh-bus]
seats:
  mailer:
    scope: mesh
    accepts: [send]
    serves: [status]
    versions:
      v2:
        accepts: [send]
        serves: [status, queue]
`
	builder := "module: builder\nrequires: [mesh-bus]\nseats:\n  mesh-build-machine:\n    scope: mesh\n    retain: 7d\n    accepts: [build]\n    emits: [built, failed]\n    serves: [status, queue]\n"
	mods := []api.ModuleInfo{
		{Module: "mailer", Seats: []string{"mailer"}, Manifest: mailer},
		{Module: "billing", Tools: []string{"status"}},
		{Module: "builder", Seats: []string{"mesh-build-machine"}, Manifest: builder},
		{Module: "odd", Seats: []string{"odd"}, Manifest: "module: odd\nunknown: key\n"},
	}
	for _, tc := range []struct {
		target, tool, subject string
	}{
		{"billing", "status", manifest.ToolSubject("billing", "status")},
		{"mailer", "status", manifest.SeatToolSubject("mailer", "status")},
		{"mailer", "queue", manifest.SeatToolSubjectAt("mailer", "v2", "queue")},
		{"mesh-controller", "list", manifest.SeatToolSubject("mesh-controller", "list")},
		// A module holding one of the mesh's own seats may serve more than the built-in.
		{"mesh-build-machine", "queue", manifest.SeatToolSubject("mesh-build-machine", "queue")},
		// A declaring module whose manifest no longer reads: v1's subject, not a refusal.
		{"odd", "status", manifest.SeatToolSubject("odd", "status")},
	} {
		got, err := operatorToolSubject(mods, tc.target, tc.tool)
		if err != nil || got != tc.subject {
			t.Errorf("operatorToolSubject(%s, %s)=%q, %v; want %q", tc.target, tc.tool, got, err, tc.subject)
		}
	}
	for _, tc := range []struct {
		target, tool, says string
	}{
		{"mailer", "nope", "neither module mailer nor its seat mailer declares a tool \"nope\" (the module declares [], the seat serves [status queue])"},
		{"billing", "nope", "module billing declares no tool \"nope\" (it declares [status])"},
		{"mesh-controller", "nope", "seat mesh-controller serves no tool \"nope\""},
		{"mesh-controller", "whoami", "call it with the module's seed (--creds)"},
		{"shop", "status", "no module or seat named \"shop\""},
	} {
		_, err := operatorToolSubject(mods, tc.target, tc.tool)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("operatorToolSubject(%s, %s): err=%v, want it to say %q", tc.target, tc.tool, err, tc.says)
		}
	}
}
