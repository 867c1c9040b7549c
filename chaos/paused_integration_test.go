//go:build integration

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
)

// TestIntegration_PausedControllerStopsTakingRequests: the controller's node is paused
// (SIGSTOP) in a mesh of three. Another node takes the seat within the lease's TTL, but the
// paused node's queue subscription to the controller's tools stays in the other servers'
// interest until they drop its routes as stale; until then about every other registration
// is handed to the paused node and times out (the chaos runs saw registrations stall for
// over 30 s). The servers ping their routes often enough to drop a silent peer within
// about 20 s: within pausedBound of the pause, every registration through a running node
// goes through.
func TestIntegration_PausedControllerStopsTakingRequests(t *testing.T) {
	c := StartCluster(t, Options{Servers: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	holder := controllerNode(t, ctx, c)
	via := (holder + 1) % len(c.Nodes)
	n := 0
	register := func() error {
		n++
		path := filepath.Join(t.TempDir(), "m.yaml")
		text := fmt.Sprintf("module: paused%d\nrequires: [mesh-bus]\nemits: [ping]\n", n)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		r := c.Nodes[via].Meshnode(t, "module", "register", path, "--creds-out", filepath.Join(t.TempDir(), "m.nk"))
		if r.Code != 0 {
			return fmt.Errorf("register through node %s: exit %d %s", c.Nodes[via].Name(), r.Code, r.Stderr)
		}
		return nil
	}
	if err := register(); err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[holder].Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	t.Logf("paused node %s, the controller's", c.Nodes[holder].Name())
	defer c.Nodes[holder].Resume()
	// Wait past the bound (registrations may fail until then), then every one must succeed.
	testbed.RetryUntil(t, pausedBound+30*time.Second, func() error {
		err := register()
		if err == nil && time.Since(paused) < pausedBound {
			return fmt.Errorf("registered %s after the pause: waiting for the bound", time.Since(paused).Round(time.Millisecond))
		}
		return err
	})
	var failed []string
	for range 6 {
		if err := register(); err != nil {
			failed = append(failed, fmt.Sprintf("%s after the pause: %v", time.Since(paused).Round(time.Millisecond), err))
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 6 registrations through node %s failed %s after the controller's node was paused:\n%v",
			len(failed), c.Nodes[via].Name(), pausedBound, failed)
	}
}

// pausedBound is how long after a server is paused the others may still hand it requests:
// the lease's TTL for another node to take the seat, and the routes' pings (5 s, three
// missed) to drop the paused server, with a loaded machine's slack.
const pausedBound = 30 * time.Second

// controllerNode is the index of the node whose controller holds the mesh-controller seat.
func controllerNode(t *testing.T, ctx context.Context, c *Cluster) int {
	t.Helper()
	nc, err := c.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	at := -1
	testbed.RetryUntil(t, time.Minute, func() error {
		kv, err := js.KeyValue(ctx, seats.Bucket)
		if err != nil {
			return err
		}
		e, err := kv.Get(ctx, seats.Key(manifest.ControllerSeat, manifest.ScopeMesh, ""))
		if err != nil {
			return fmt.Errorf("the controller's lease: %w", err)
		}
		var l seats.Lease
		if err := json.Unmarshal(e.Value(), &l); err != nil {
			return err
		}
		if at = slices.IndexFunc(c.Nodes, func(n *Node) bool { return n.Name() == l.Node }); at < 0 {
			return fmt.Errorf("the controller's lease names node %q", l.Node)
		}
		return nil
	})
	return at
}
