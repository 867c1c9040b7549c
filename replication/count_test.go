package replication_test

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/replication"
	bolt "go.etcd.io/bbolt"
)

// TestCount: the founding number counts until the registry has held that many servers; from
// then on the registry's count does, across a restart (a removal leaves four of five); a mesh
// grown to more founds anew.
func TestCount(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meshnode.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	founded, registered := 5, 0
	c := replication.NewCount(db, func() int { return founded }, func() int { return registered }, slog.New(slog.DiscardHandler))
	for _, step := range []struct{ registered, want int }{{0, 5}, {3, 5}, {5, 5}, {4, 4}, {6, 6}, {4, 4}} {
		registered = step.registered
		if got := c.Servers(); got != step.want {
			t.Fatalf("%d of %d founders registered: %d servers, want %d", registered, founded, got, step.want)
		}
	}
	db.Close()
	if db, err = bolt.Open(path, 0o600, nil); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c = replication.NewCount(db, func() int { return founded }, func() int { return registered }, slog.New(slog.DiscardHandler))
	if got := c.Servers(); got != 4 {
		t.Fatalf("after a restart with four of five registered: %d servers, want 4", got)
	}
	founded = 7 // grown: the new founding number counts until all are registered
	if got := c.Servers(); got != 7 {
		t.Fatalf("grown to 7 with 4 registered: %d servers, want 7", got)
	}
}
