package site_test

import (
	"context"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/site"
)

// TestHub_EnrolSaysWhatTheServerLacks: a server that takes no sites, or cannot tell a site
// where to link (leaf-addr on every interface, no advertise), refuses an enrolment saying
// which setting to add — not that it takes no sites when leaf-addr is set.
func TestHub_EnrolSaysWhatTheServerLacks(t *testing.T) {
	for _, c := range []struct {
		leaf, want string
	}{
		{"", "set leaf-addr"},
		{"0.0.0.0:7422", "set --advertise"},
	} {
		_, err := site.Hub{Config: config.Config{LeafAddr: c.leaf}}.Enrol(context.Background(), "oslo", "U")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("leaf-addr %q: enrol refused with %v, want it to say %q", c.leaf, err, c.want)
		}
	}
}
