package ensure

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// TestErrStorageExceeded: the code ensure spells out is still nats-server's own.
func TestErrStorageExceeded(t *testing.T) {
	if got, want := errStorageExceeded, jetstream.ErrorCode(server.JSStorageResourcesExceededErr); got != want {
		t.Fatalf("errStorageExceeded=%d, want nats-server's JSStorageResourcesExceededErr %d", got, want)
	}
}
