package node_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestBed_ViolationLogNamesModule: a module's denied publish is logged at warning level
// naming the module and its key, which nats-server's own line does not.
func TestBed_ViolationLogNamesModule(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, reg := b.register("module: billing\nrequires: [mesh-bus]\nemits: [invoice.sent]\n")
	nc := b.raw(seed, "billing")
	const forbidden = "mesh.mod.other.tool.status"
	if !refusedPub(t, nc, forbidden) {
		t.Fatalf("billing published on %s", forbidden)
	}
	want := fmt.Sprintf("module=billing key=%s", reg.PublicKey)
	retryUntil(t, 10*time.Second, func() error {
		for _, line := range strings.Split(b.n.log.String(), "\n") {
			if strings.Contains(line, "Publish Violation") && strings.Contains(line, forbidden) {
				if !strings.Contains(line, "level=WARN") || !strings.Contains(line, want) {
					return fmt.Errorf("logged %q, want a warning with %q", line, want)
				}
				return nil
			}
		}
		return errors.New("the violation is not logged")
	})
}
