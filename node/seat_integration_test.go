//go:build integration

package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats.go/jetstream"
)

// leaseWrites records every write of one lease key as the bucket's watch delivers them, in
// the bucket's order: the instance each put names (a renewal names its holder again), "-"
// for a delete (a release or an expiry).
type leaseWrites struct {
	mu     sync.Mutex
	writes []string
}

func (w *leaseWrites) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, s)
}

// since returns the writes from the i-th on.
func (w *leaseWrites) since(i int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i > len(w.writes) {
		return nil
	}
	return append([]string(nil), w.writes[i:]...)
}

func (w *leaseWrites) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.writes)
}

// TestIntegration_Seat_OneHolderAcrossNodes (issue 38): a mesh-scoped seat has one holder in
// the whole mesh. Instances on each of three nodes wait for it; each time its holder closes,
// the three nodes' runners see the seat free at once and race for it, and the leases' bucket
// lets one of them take it (the lease is created, never put over another: with Put, two
// nodes both held it until the first one's renewal failed). Watched on the bucket, every
// lease written after a release, until the next holder has renewed twice, is that holder's.
func TestIntegration_Seat_OneHolderAcrossNodes(t *testing.T) {
	c := newCluster(t)
	var reg *admin.Registered
	retryUntil(t, 30*time.Second, func() (err error) {
		reg, err = admin.Register(c.ctx(), c.op, []byte(mailerManifest))
		return err
	})
	seed := filepath.Join(t.TempDir(), "mailer.nk")
	if err := os.WriteFile(seed, reg.Seed, 0o600); err != nil {
		t.Fatal(err)
	}
	kv, err := c.js.KeyValue(c.ctx(), seats.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	var writes leaseWrites
	watch, err := kv.Watch(c.ctx(), "mailer", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	go func() {
		for e := range watch.Updates() {
			if e == nil {
				continue
			}
			var l seats.Lease
			if e.Operation() != jetstream.KeyValuePut || json.Unmarshal(e.Value(), &l) != nil {
				writes.add("-")
				continue
			}
			writes.add(l.Instance + "@" + l.Node)
		}
	}()
	connectOn := func(i int) *sdk.Client {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cl, err := sdk.Connect(ctx, c.nodes[i].ClientURL(), seed)
		if err != nil {
			t.Fatalf("connect on %s: %v", c.cfgs[i].Name, err)
		}
		t.Cleanup(func() { cl.Close() })
		if err := cl.Accept("send", func(context.Context, sdk.Job) error { return nil }); err != nil {
			t.Fatal(err)
		}
		return cl
	}
	// One waiting instance on each node; a closed holder is replaced by a new instance on
	// its node, so that every round is a race of three nodes.
	clients := []*sdk.Client{connectOn(0), connectOn(1), connectOn(2)}
	h := holder(t, "mailer", clients...)
	for round := range 4 {
		// The instance that holds the seat by its sdk is the one the bucket's lease names.
		e, err := kv.Get(c.ctx(), "mailer")
		if err != nil {
			t.Fatalf("round %d: %s holds mailer, and the bucket: %v", round, h.Instance(), err)
		}
		var l seats.Lease
		if err := json.Unmarshal(e.Value(), &l); err != nil || l.Instance != h.Instance() {
			t.Fatalf("round %d: two holders: %s holds mailer by its sdk, and the bucket's lease is %s on %s (%v)", round, h.Instance(), l.Instance, l.Node, err)
		}
		i := 0
		for clients[i] != h {
			i++
		}
		from, old := writes.len(), h.Instance()+"@"
		h.Close()
		clients[i] = connectOn(i)
		h = holder(t, "mailer", clients...)
		// The next holder has renewed twice: its lease is the bucket's, and any other
		// node's acquire in the race would be written before.
		retryUntil(t, 20*time.Second, func() error {
			ws := writes.since(from)
			// From the release on: the old holder may have renewed just before it. The
			// bucket keeps one entry a key, so a release the watch has not delivered yet is
			// gone once the next lease is created: then the first lease not the old
			// holder's stands for it.
			released := slices.Index(ws, "-")
			if released < 0 {
				released = slices.IndexFunc(ws, func(w string) bool { return !strings.HasPrefix(w, old) })
			}
			if released < 0 {
				return fmt.Errorf("round %d: the release is not written yet: %v", round, ws)
			}
			if slices.ContainsFunc(ws[released:], func(w string) bool { return strings.HasPrefix(w, old) }) {
				t.Fatalf("round %d: the closed holder's lease was written after the release: %v", round, ws)
			}
			held := map[string]int{}
			for _, w := range ws[released:] {
				if w != "-" {
					held[w]++
				}
			}
			if len(held) > 1 {
				t.Fatalf("round %d: after the release, the bucket took leases of %d holders: %v", round, len(held), ws)
			}
			for w, n := range held {
				if n < 3 {
					return fmt.Errorf("round %d: %s's lease written %d times, want an acquire and two renewals", round, w, n)
				}
			}
			if len(held) == 0 {
				return fmt.Errorf("round %d: no lease written since the release: %v", round, ws)
			}
			return nil
		})
	}
}
