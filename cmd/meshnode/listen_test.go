package main

import (
	"strings"
	"testing"

	"github.com/meshnode/meshnode/api"
)

// TestUnheardEmitter: listen says when its pattern's emitter is no registered module or
// declared seat — `mod.shop.**`, once suggested for `mesh.mod.shop.>`, heard nothing.
func TestUnheardEmitter(t *testing.T) {
	mods := []api.ModuleInfo{{Module: "shop"}, {Module: "mailer", Seats: []string{"mailer"}}}
	for pattern, says := range map[string]string{
		"shop.**":                 "",
		"**":                      "",
		"*.order.placed":          "",
		"seat.mailer.delivered":   "",
		"seat.*.delivered":        "",
		"seat.mesh-controller.**": "",
		"mod.shop.**":             `no module "mod" is registered`,
		"seat.nope.sent":          `no registered module declares a seat "nope"`,
	} {
		got := unheardEmitter(mods, pattern)
		if (says == "") != (got == "") || !strings.Contains(got, says) {
			t.Errorf("unheardEmitter(%q)=%q, want %q", pattern, got, says)
		}
	}
}
