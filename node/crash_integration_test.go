//go:build integration

package node_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"
)

// TestIntegration_Dead_JobKillsEveryHolder: a seat job whose holder process dies on it (kill -9), with
// three holder processes in turn and every dead one replaced: the job is delivered
// MaxDeliver times, then the node dead-letters it and removes it from the queue, so no
// holder ever gets it a sixth time. A consumer recreated per holder would count each
// holder's delivery as the first and hand the job round for good.
func TestIntegration_Dead_JobKillsEveryHolder(t *testing.T) {
	b := newBed(t)
	seedW, _ := b.register("module: worker\nrequires: [mesh-bus]\nseats:\n  jobs: {scope: mesh, retain: 1h, accepts: [run]}\n")
	seedS, _ := b.register("module: shop\nrequires: [mesh-bus]\nuses: [jobs]\n")
	log := filepath.Join(t.TempDir(), "deliveries")
	stop := superviseHolders(t, 3, fmt.Sprintf("%s %s %s", b.n.ClientURL(), seedW, log))
	defer stop()

	ids := submit(t, b.client(seedS), "jobs", "run", 1)
	stream, consumer := manifest.SeatStreamName("jobs"), manifest.SeatConsumerName("jobs", manifest.ScopeMesh, "")
	letters := awaitDeadFor(t, b, manifest.DeadSubject(stream, consumer), 1, 90*time.Second, nil)
	if got := letters[0].Header.Get("x-event-id"); got != ids[0] {
		t.Errorf("dead letter of %q, want the job %s", got, ids[0])
	}
	// Gone from the queue and from the consumer: no delivery can follow.
	consumerIdle(t, b, stream, consumer)
	deliveries := readLines(t, log)
	pids := map[string]bool{}
	for _, l := range deliveries {
		id, pid, _ := strings.Cut(l, " ")
		if id != ids[0] {
			t.Errorf("delivery of %q, want only the job %s", id, ids[0])
		}
		pids[pid] = true
	}
	if len(deliveries) != manifest.MaxDeliver || len(pids) != manifest.MaxDeliver {
		t.Errorf("the job was delivered %d times to %d processes, want %d each:\n%s",
			len(deliveries), len(pids), manifest.MaxDeliver, strings.Join(deliveries, "\n"))
	}
	if d := letters[0].Header.Get("x-dead-deliveries"); d != fmt.Sprint(manifest.MaxDeliver) {
		t.Errorf("x-dead-deliveries %q, want %d", d, manifest.MaxDeliver)
	}
}

// superviseHolders keeps n crashing-holder processes running, starting a new one whenever
// one dies, until the returned stop is called.
func superviseHolders(t *testing.T, n int, env string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), crashingHolderEnv+"="+env)
				out, err := cmd.CombinedOutput()
				if ctx.Err() == nil && len(out) > 0 {
					t.Logf("holder process %d: %v\n%s", i, err, out)
				}
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// readLines returns the lines of a file.
func readLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}
