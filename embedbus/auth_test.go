package embedbus

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestRefusedOwn: the bus refusing the node's own connection is logged as an error that
// names the subject and calls it a defect; another asynchronous error is a warning.
func TestRefusedOwn(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	refused := refusedOwn(log)
	// As nats.go hands it over: no subscription, the subject in the error.
	refused(nil, nil, fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, "mesh.mod.x.event.y"))
	if got := buf.String(); !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "a defect of meshnode") || !strings.Contains(got, "mesh.mod.x.event.y") {
		t.Errorf("a permission violation logged as %q", got)
	}
	buf.Reset()
	refused(nil, nil, nats.ErrSlowConsumer)
	if got := buf.String(); !strings.Contains(got, "level=WARN") || strings.Contains(got, "defect") {
		t.Errorf("a slow consumer logged as %q", got)
	}
}
