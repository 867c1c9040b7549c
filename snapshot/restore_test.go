package snapshot_test

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/snapshot"
)

// TestResume_Refuses: a node restoring from a snapshot that is gone, or that is another
// snapshot now, refuses to start and says what to put back — before it touches its bus.
func TestResume_Refuses(t *testing.T) {
	path, _ := mustSave(t, mustMesh(t))
	r, err := snapshot.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := r.ManifestSum()
	r.Close()
	noPhase := func(string) {}
	for _, c := range []struct {
		what string
		from genesis.Restoring
		says string
	}{
		{"a file gone", genesis.Restoring{File: filepath.Join(t.TempDir(), "gone.snap"), SHA256: sum}, "which is gone: put the file back"},
		{"another snapshot", genesis.Restoring{File: path, SHA256: "0123"}, "is another snapshot now"},
	} {
		f := &genesis.Foundation{MeshID: "mesh-1", Restoring: &c.from}
		err := snapshot.Resume(testContext(t), nil, t.TempDir(), f, nil, 1, noPhase, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Resume from %s: %v, want it to say %q", c.what, err, c.says)
		}
	}
	// Not restoring: nothing to do.
	if err := snapshot.Resume(testContext(t), nil, t.TempDir(), &genesis.Foundation{}, nil, 1, noPhase, nil); err != nil {
		t.Fatalf("Resume of a foundation that is not restoring: %v", err)
	}
}
