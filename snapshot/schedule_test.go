package snapshot_test

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/alarm"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/recovery"
	"github.com/meshnode/meshnode/snapshot"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSchedule_Run: a schedule on a real server writes a snapshot into its directory at once
// that Open accepts whole, with the foundation sealed under the barrier key (the recovery
// key opens it) and the node's audit head: restorable as a manual one.
func TestSchedule_Run(t *testing.T) {
	m := mustMesh(t)
	barrier := make([]byte, 32)
	rand.Read(barrier)
	found := recovery.Foundation{RouteSecret: []byte("route"), GossipKey: []byte("gossip"), VaultSeed: []byte("SUVAULT")}
	alarms := &alarm.Set{}
	s := &snapshot.Schedule{
		Interval: time.Hour, Dir: filepath.Join(t.TempDir(), "snapshots"), Keep: 3,
		Conn: m.nc, MeshID: "mesh-1", Operator: "UOPERATOR", Version: "v9.9.9", Node: "n1",
		Seal: func() (*api.SealedFoundation, error) { return recovery.Seal(barrier, "mesh-1", found) },
		AuditQuery: func(api.AuditFilter) ([]api.AuditRecord, error) {
			return []api.AuditRecord{{N: 41, Hash: "abc"}}, nil
		},
		Holds: func() bool { return true }, Alarms: alarms,
		LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "last"}),
		Failures:    prometheus.NewCounter(prometheus.CounterOpts{Name: "failures"}),
		Log:         slog.New(slog.DiscardHandler),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testbed.RetryUntil(t, 30*time.Second, func() error {
		if testutil.ToFloat64(s.LastSuccess) == 0 {
			return errors.New("no scheduled snapshot yet")
		}
		return nil
	})
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	at := time.Unix(int64(testutil.ToFloat64(s.LastSuccess)), 0)
	if want := []string{snapshot.ScheduledName(at)}; !slices.Equal(names, want) {
		t.Fatalf("snapshot-dir holds %v, want %v", names, want)
	}
	r, err := snapshot.Open(filepath.Join(s.Dir, names[0]))
	if err != nil {
		t.Fatalf("Open refuses the scheduled snapshot: %v", err)
	}
	defer r.Close()
	man := r.Manifest()
	if man.MeshID != "mesh-1" || man.Operator != "UOPERATOR" || len(man.Streams) != 5 {
		t.Fatalf("manifest mesh %q, operator %q, %d streams; want mesh-1, UOPERATOR, 5", man.MeshID, man.Operator, len(man.Streams))
	}
	if got, err := recovery.Open(barrier, man.Foundation); err != nil || string(got.VaultSeed) != "SUVAULT" {
		t.Fatalf("the file's foundation opens to %+v, %v; want the node's", got, err)
	}
	if got, want := man.AuditHeads["n1"], (api.AuditHead{N: 41, Hash: "abc"}); got != want {
		t.Fatalf("audit head of n1 %+v, want %+v", got, want)
	}
	if err := alarms.Err(); err != nil {
		t.Fatalf("alarm after a successful snapshot: %v", err)
	}
}
