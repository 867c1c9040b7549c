package node_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/snapshot"
)

// TestNode_ScheduledSnapshot: a node holding mesh-controller with snapshot-interval set
// writes a snapshot into <data-dir>/snapshots at once, whole and carrying the sealed
// foundation and its audit head, and its metric says when; a snapshot-dir it cannot write
// is an alarm in /readyz.
func TestNode_ScheduledSnapshot(t *testing.T) {
	t.Run("written", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t.TempDir(), "n1")
		cfg.SnapshotInterval = config.Duration(time.Minute)
		n := MustOpenNode(t, cfg)
		dir := filepath.Join(cfg.DataDir, "snapshots")
		var name string
		retryUntil(t, 30*time.Second, func() error {
			entries, err := os.ReadDir(dir)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), "snapshot-") && strings.HasSuffix(e.Name(), ".tar") {
					name = e.Name()
					return nil
				}
			}
			return errors.Join(errors.New("no scheduled snapshot yet"), err)
		})
		r, err := snapshot.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("Open refuses the scheduled snapshot: %v", err)
		}
		defer r.Close()
		man := r.Manifest()
		if man.Foundation == nil || man.MeshID == "" || len(man.Streams) == 0 {
			t.Fatalf("manifest of mesh %q with %d streams, foundation %v: want the mesh's, sealed", man.MeshID, len(man.Streams), man.Foundation)
		}
		if _, ok := man.AuditHeads["n1"]; !ok {
			t.Fatalf("audit heads %v, want n1's", man.AuditHeads)
		}
		retryUntil(t, 10*time.Second, func() error {
			_, metrics := httpGet(t, n.HTTPURL()+"/metrics")
			if strings.Contains(metrics, "meshnode_snapshot_last_success_timestamp_seconds 0\n") {
				return errors.New("last success metric still 0")
			}
			return nil
		})
		if code, reason := readyz(t, n); code != 200 {
			t.Fatalf("/readyz %d after a scheduled snapshot: %s", code, reason)
		}
	})
	t.Run("alarm", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t.TempDir(), "n2")
		cfg.SnapshotInterval = config.Duration(time.Minute)
		blocker := filepath.Join(t.TempDir(), "a-file")
		if err := os.WriteFile(blocker, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.SnapshotDir = filepath.Join(blocker, "snapshots") // under a file: never made
		n := MustOpenNode(t, cfg)
		retryUntil(t, 30*time.Second, func() error {
			if code, reason := readyz(t, n); code != 503 || !strings.Contains(reason, "scheduled snapshot") {
				return errors.New("no scheduled snapshot alarm in /readyz yet")
			}
			return nil
		})
		_, metrics := httpGet(t, n.HTTPURL()+"/metrics")
		if !strings.Contains(metrics, "meshnode_snapshot_failures_total 1") {
			t.Fatalf("failures metric not 1 after the failure")
		}
	})
}
