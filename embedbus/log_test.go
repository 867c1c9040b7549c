package embedbus

import (
	"strings"
	"testing"
)

// TestLogger_RedactsPasswords: a route's URL, as nats-server prints it when it removes one,
// reaches the log without the mesh's route credential.
func TestLogger_RedactsPasswords(t *testing.T) {
	got := redact("Removed route %v", []any{"nats-route://route:s3cr3t-Pa55@127.0.0.1:6222"})
	if strings.Contains(got, "s3cr3t") || !strings.Contains(got, "nats-route://route:REDACTED@127.0.0.1:6222") {
		t.Fatalf("logged %q", got)
	}
	if got := redact("Listening for route connections on %s:%d", []any{"0.0.0.0", 6222}); got != "Listening for route connections on 0.0.0.0:6222" {
		t.Fatalf("logged %q", got)
	}
}
