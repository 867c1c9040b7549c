//go:build integration

package node_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/snapshot"
)

// TestIntegration_ScheduledSnapshot_FollowsController: in a mesh of three with
// snapshot-interval set, only the holder of mesh-controller writes snapshots; stopped, the
// server that takes the seat writes the next into its own snapshot-dir, a whole file with
// the foundation sealed by its own vault.
func TestIntegration_ScheduledSnapshot_FollowsController(t *testing.T) {
	c := newClusterWith(t, func(_ int, cfg *config.Config) { cfg.SnapshotInterval = config.Duration(time.Minute) })
	// written lists the scheduled snapshots in node i's snapshot-dir.
	written := func(i int) []string {
		entries, _ := os.ReadDir(c.cfgs[i].ScheduledSnapshotDir())
		var out []string
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "snapshot-") && strings.HasSuffix(e.Name(), ".tar") {
				out = append(out, e.Name()) // not a save's FILE.tmp or spool under way
			}
		}
		return out
	}
	holder := -1
	retryUntil(t, 60*time.Second, func() error {
		holder = -1
		for i := range c.cfgs {
			if len(written(i)) > 0 {
				if holder >= 0 {
					return fmt.Errorf("both %s and %s wrote scheduled snapshots", c.cfgs[holder].Name, c.cfgs[i].Name)
				}
				holder = i
			}
		}
		if holder < 0 {
			return errors.New("no scheduled snapshot yet")
		}
		return nil
	})
	c.stop(holder)
	next := -1
	retryUntil(t, 90*time.Second, func() error {
		for i := range c.cfgs {
			if i != holder && len(written(i)) > 0 {
				next = i
				return nil
			}
		}
		return errors.New("no other server wrote a scheduled snapshot after the holder stopped")
	})
	r, err := snapshot.Open(filepath.Join(c.cfgs[next].ScheduledSnapshotDir(), written(next)[0]))
	if err != nil {
		t.Fatalf("Open refuses %s's scheduled snapshot: %v", c.cfgs[next].Name, err)
	}
	defer r.Close()
	if man := r.Manifest(); man.Foundation == nil || len(man.Streams) == 0 {
		t.Fatalf("%s's scheduled snapshot: %d streams, foundation %v; want the mesh's, sealed", c.cfgs[next].Name, len(man.Streams), man.Foundation)
	}
}
