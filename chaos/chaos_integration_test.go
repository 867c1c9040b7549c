//go:build integration

package chaos

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
)

var (
	chaosDuration = flag.Duration("chaos.duration", 3*time.Minute, "how long the nemesis injects faults (the long run: 30m)")
	chaosSeed     = flag.Int64("chaos.seed", 38, "the seed that draws the nemesis's schedule")
)

// TestChaos runs the workload on five meshnode processes, each in its own network namespace,
// while the nemesis injects every kind of fault (double faults among them) on a schedule the
// seed draws; then heals, reads what the mesh holds, and checks the recorded history: no acked
// event lost or handled twice beyond what dedup allows, seat effects fenced, the lease history
// linearizable, every acked secret read back on every node and none in plaintext on disk, the
// mesh ready again within a bound. CI runs the fixed seed for about 3 minutes;
//
//	go test -tags integration -run TestChaos ./chaos -chaos.duration 30m -chaos.seed N
//
// runs a long one.
func TestChaos(t *testing.T) {
	// Three found the mesh and two join while the workload runs: the grow from 3 to 5 is part
	// of every schedule, and the faults that follow hit a mesh of five.
	// `ip netns exec` mounts a fresh /sys without the cgroup hierarchy, so the nodes run their
	// deployed modules with the isolation the namespace gives (isolation: reduced).
	c := StartCluster(t, Options{Servers: 3, Spare: 2, Flags: []string{"--isolation", "reduced"}})
	h := NewHistory()
	log := slog.New(slog.NewTextHandler(&logSink{t: t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), *chaosDuration+10*time.Minute)
	defer cancel()
	w, err := StartWorkload(t, ctx, c, h, t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	grown := time.Now()
	c.Grow(t, 2)
	t.Logf("grew from 3 to 5 servers in %s, under the workload", time.Since(grown).Round(time.Millisecond))
	nm := NewNemesis(c, *chaosSeed)
	nm.DriftTargets(Consumers, Streams)
	nm.Logf = t.Logf
	// A killed node has twice taken about 2 minutes to come back (CI, and a long run: its
	// bus started 2 minutes after the restart; not yet explained, docs/chaos.md). The
	// schedule waits for it rather than stop there; the last fault's recovery is still held
	// to the ready check's 2 minutes.
	nm.Recover = 5 * time.Minute
	// A fault the mesh is slow to recover from (a replica whose catch-up nats-server retries
	// for a minute and more after a partition) must not leave a kind out of the schedule:
	// the first round is finished past the duration.
	nm.Cover = true
	t.Logf("seed %d, faults for %s", *chaosSeed, *chaosDuration)
	runErr := nm.Run(ctx, *chaosDuration)
	healed := time.Now()
	if runErr != nil {
		t.Logf("the nemesis stopped early: %v", runErr) // said now: a failed read after healing ends the test
	}
	for _, f := range nm.Faults() {
		switch f.Kind {
		case KindDriftStream:
			h.Span("nemesis", "wipe", strings.TrimPrefix(f.Target, "SEAT_"), "", f.Start, f.End)
		case KindDriftConsumer:
			h.Span("nemesis", "remake", strings.TrimPrefix(f.Target, manifest.EventsStreamName+"/"), "", f.Start, f.End)
		}
	}
	var readyAt time.Time
	const readyBound = 2 * time.Minute
	for time.Since(healed) < readyBound {
		if c.Settled() == nil {
			readyAt = time.Now()
			break
		}
		time.Sleep(500 * time.Millisecond) // polled: Settled asks every node
	}
	// The workload goes on a little on the healed mesh; then its loads stop, and the reads
	// wait (bounded) for the consumers and the seat's holder to catch up.
	time.Sleep(5 * time.Second) // a span of operations on the healed mesh, not a wait for a state
	w.StopLoads()
	final, err := w.Final(ctx, 90*time.Second)
	w.Stop()
	if err != nil {
		t.Fatalf("read the mesh after healing: %v", err)
	}
	t.Logf("catch-up: the wait for the consumers and the seat's holder ended %s after the loads stopped", final.CatchUp.Round(time.Second))
	final.HealedAt, final.ReadyAt, final.ReadyBound = healed, readyAt, readyBound
	rep := Check(h.Ops(), final, WorkloadBounds())
	for _, s := range c.SlowStarts() {
		t.Logf("slow start: %s", s)
	}
	for _, e := range c.Exits() {
		t.Errorf("exit: %s", e)
	}
	rep.Faults = nm.Counts()
	rep.Faults["clock-skew"] = w.ClockSkews()
	fmt.Println(rep.String())
	if runErr != nil {
		t.Errorf("the nemesis: %v", runErr)
	}
	var none []string
	for kind, n := range nm.Counts() {
		if n == 0 {
			none = append(none, kind)
		}
	}
	sort.Strings(none)
	if len(none) > 0 {
		t.Errorf("the schedule injected no %s: the first round was not finished", strings.Join(none, ", "))
	}
	if a := rep.Anomalies(); len(a) > 0 {
		keepAnomalies(t, rep, fmt.Sprint(*chaosSeed))
		t.Logf("the Node.js module's last lines:\n%s", w.JSLog())
		t.Errorf("%d anomalies (above)", len(a))
	}
}

// keepAnomalies writes, for a run that found anomalies, every anomaly with all of its
// operations (the report shows a slice of each) and porcupine's rendering of the lease
// histories that failed, to files named after tag in the temporary directory.
func keepAnomalies(t *testing.T, rep *Report, tag string) {
	all := filepath.Join(os.TempDir(), fmt.Sprintf("chaos-anomalies-%s.txt", tag))
	var b strings.Builder
	for _, x := range rep.Anomalies() {
		fmt.Fprintf(&b, "%s/%s: %s\n", x.Check, x.Kind, x.Msg)
		for _, op := range x.Ops {
			fmt.Fprintf(&b, "    %s\n", op)
		}
	}
	if os.WriteFile(all, []byte(b.String()), 0o644) == nil {
		t.Logf("every anomaly: %s", all)
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("chaos-leases-%s.html", tag))
	if ok, err := rep.VisualizeLeases(path); ok && err == nil {
		t.Logf("the lease histories that failed: %s", path)
	}
}

// logSink writes the workload's clients' warnings to the test's log.
type logSink struct{ t *testing.T }

func (s *logSink) Write(p []byte) (int, error) {
	s.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
