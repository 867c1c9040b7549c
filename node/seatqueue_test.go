package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestSeatQueue_OldReservationShrinksOnRestart is issue 37's upgrade of a seat's queue on a
// node: a queue reserving what an earlier version gave every seat (256 MiB here) and holding
// more jobs than the seat's new default allows is resized to the default when the restarted
// node's controller reconciles, and keeps every job.
func TestSeatQueue_OldReservationShrinksOnRestart(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.StoreMaxBytes = 2 << 30 // a default seat: the 1 MiB floor
	b := newBedAt(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.register("module: mailer\nrequires: [mesh-bus]\nseats:\n  work: {scope: mesh, retain: 1h, accepts: [do]}\n")
	stream, err := b.js.Stream(ctx, manifest.SeatStreamName("work"))
	if err != nil {
		t.Fatal(err)
	}
	def := stream.CachedInfo().Config.MaxBytes
	if def != 1<<20 {
		t.Fatalf("SEAT_work reserves %d, want the default 1 MiB", def)
	}
	// As an earlier version made it.
	old := stream.CachedInfo().Config
	old.MaxBytes = 256 << 20
	if _, err := b.js.UpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	const jobs = 3
	for i := range jobs {
		job := fmt.Sprintf(`{"n":%d,"pad":%q}`, i, strings.Repeat("x", 512<<10))
		if _, err := b.js.Publish(ctx, "mesh.seat.work.accept.do", []byte(job)); err != nil {
			t.Fatalf("queue job %d: %v", i, err)
		}
	}

	b.close()
	b = newBedAt(t, cfg)
	var info *jetstream.StreamInfo
	retryUntil(t, 30*time.Second, func() error {
		if stream, err = b.js.Stream(ctx, manifest.SeatStreamName("work")); err != nil {
			return err
		}
		if info = stream.CachedInfo(); info.Config.MaxBytes != def {
			return fmt.Errorf("SEAT_work reserves %d after the restart, want %d", info.Config.MaxBytes, def)
		}
		return nil
	})
	if info.State.Msgs != jobs {
		t.Fatalf("SEAT_work holds %d jobs after it was resized, want %d", info.State.Msgs, jobs)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("job at %d: %v", seq, err)
		}
		if want := fmt.Sprintf(`{"n":%d,`, seq-info.State.FirstSeq); !strings.HasPrefix(string(m.Data), want) {
			t.Errorf("job at %d starts %.10q, want %s", seq, m.Data, want)
		}
	}
}
