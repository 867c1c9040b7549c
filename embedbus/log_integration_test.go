//go:build integration

package embedbus

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestIntegration_DeadPeerLoggedOnce: of two clustered servers, one stops; the other
// retries its routes to it every second on each pooled connection, and its log says so
// once (at error level), the retries going to debug level only.
func TestIntegration_DeadPeerLoggedOnce(t *testing.T) {
	addrs := []string{testbed.FreeAddr(t), testbed.FreeAddr(t)}
	// Only a dials b (b's route is to itself, which nats-server ignores): a server retries
	// only the routes it dialled, and each would otherwise race to dial the other first.
	routes := [][]string{{"nats-route://" + addrs[0], "nats-route://" + addrs[1]}, {"nats-route://" + addrs[1]}}
	logs := []*testbed.SyncBuffer{{}, {}}
	buses := make([]*Bus, 2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, name := range []string{"a", "b"} {
		kp, pub := newUser(t)
		dir := &keys{pub: map[string]bool{pub: true}, asked: map[string]int{}}
		log := slog.New(slog.NewTextHandler(logs[i], &slog.HandlerOptions{Level: slog.LevelDebug}))
		wg.Add(1)
		go func() { // the two start together: each waits for the other's routes
			defer wg.Done()
			buses[i], errs[i] = Open(context.Background(), Config{Name: name, StoreDir: t.TempDir(), ClientAddr: testbed.FreeAddr(t),
				Directory: dir, Key: kp, Logger: log, ReadyTimeout: 30 * time.Second,
				Cluster: &Cluster{Name: "mesh", Addr: addrs[i], Routes: routes[i], Secret: "s3cr3t"}})
		}()
	}
	wg.Wait()
	for i, b := range buses {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		t.Cleanup(func() { b.Close() })
	}
	buses[1].Close()

	// Wait for three rounds of retries (a second apart), at debug level.
	dial := "Error trying to connect to route (attempt 3)"
	retryUntil(t, 20*time.Second, func() error {
		if !strings.Contains(logs[0].String(), dial) {
			return fmt.Errorf("a has not retried its routes to b three times:\n%s", logs[0].String())
		}
		return nil
	})
	var errorLines []string
	for _, line := range strings.Split(logs[0].String(), "\n") {
		if strings.Contains(line, "Error trying to connect to route") && !strings.Contains(line, "level=DEBUG") {
			errorLines = append(errorLines, line)
		}
	}
	if len(errorLines) != 1 || !strings.Contains(errorLines[0], "level=ERROR") || !strings.Contains(errorLines[0], addrs[1]) {
		t.Fatalf("above debug level, a logged its dials of b:\n%s\nwant the first only", strings.Join(errorLines, "\n"))
	}
	if n := strings.Count(logs[0].String(), "Error trying to connect to route"); n < 4 {
		t.Fatalf("%d dials logged at all, want every one at debug level", n)
	}
}
