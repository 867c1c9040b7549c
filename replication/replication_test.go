package replication_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/replication"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTarget: one copy on one server, two on two, three up to four, five from five; the
// servers a replication tolerates down.
func TestTarget(t *testing.T) {
	for servers, want := range map[int]int{0: 1, 1: 1, 2: 2, 3: 3, 4: 3, 5: 5, 6: 5, 7: 5, 50: 5} {
		if got := replication.Target(servers); got != want {
			t.Errorf("Target(%d) = %d, want %d", servers, got, want)
		}
	}
	for replicas, want := range map[int]int{1: 0, 2: 0, 3: 1, 5: 2} {
		if got := replication.Tolerates(replicas); got != want {
			t.Errorf("Tolerates(%d) = %d, want %d", replicas, got, want)
		}
	}
}

// byName is a report's streams by name.
func byName(rs []api.StreamReplication) map[string]api.StreamReplication {
	out := map[string]api.StreamReplication{}
	for _, r := range rs {
		out[r.Name] = r
	}
	return out
}

// TestStreams_ScaleUpAndDown: on three servers, streams made with one copy are brought to
// three — a bucket and a stream with a durable consumer, which follows its stream — and the
// report shows each with three current copies and a quorum; an opener that asks for one copy
// again (a node with an older count) does not undo it; back to one, they are one again; a
// stream that lost its majority is reported without quorum.
func TestStreams_ScaleUpAndDown(t *testing.T) {
	servers := testbed.JetStreamCluster(t, 3)
	_, js := testbed.Connect(t, servers[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := ensure.Stream(ctx, js, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"ev.>"}, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{Durable: "shop", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := ensure.KeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: "mesh-registry", Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	scaled := func(replicas int) {
		t.Helper()
		testbed.RetryUntil(t, 45*time.Second, func() error {
			if _, err := replication.Streams(ctx, js, replicas); err != nil {
				return err
			}
			rep, err := replication.Report(ctx, js)
			if err != nil {
				return err
			}
			got := byName(rep)
			for _, name := range []string{"EVENTS", "KV_mesh-registry"} {
				if r := got[name]; r.Replicas != replicas || r.Current != replicas || !r.Quorum {
					return fmt.Errorf("%s: %+v, want %d current copies with quorum", name, r, replicas)
				}
			}
			c, err := js.Consumer(ctx, "EVENTS", "shop")
			if err != nil {
				return err
			}
			if n := len(c.CachedInfo().Cluster.Replicas) + 1; n != replicas {
				return fmt.Errorf("the consumer has %d copies, want %d with its stream", n, replicas)
			}
			return nil
		})
	}
	scaled(3)
	// A node opening the streams with an older count keeps the copies they have.
	if _, err := ensure.Stream(ctx, js, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"ev.>"}, Replicas: 1, MaxMsgs: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := ensure.KeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: "mesh-registry", Replicas: 1, History: 5}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"EVENTS", "KV_mesh-registry"} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if cfg := s.CachedInfo().Config; cfg.Replicas != 3 || cfg.MaxMsgs != 100 && name == "EVENTS" || cfg.MaxMsgsPerSubject != 5 && name != "EVENTS" {
			t.Fatalf("%s after an opener asked for one copy and a new limit: replicas %d, max msgs %d, history %d; want 3 copies and the new limit",
				name, cfg.Replicas, cfg.MaxMsgs, cfg.MaxMsgsPerSubject)
		}
	}
	// Nothing differs: a pass changes nothing.
	if changed, err := replication.Streams(ctx, js, 3); err != nil || len(changed) != 0 {
		t.Fatalf("a pass at the streams' replication: changed %v, %v", changed, err)
	}
	if _, err := replication.Streams(ctx, js, 6); err == nil {
		t.Fatal("six copies were asked for without an error: JetStream keeps at most five")
	}

	// Two of three servers down: no stream has a majority.
	servers[1].Shutdown()
	servers[2].Shutdown()
	testbed.RetryUntil(t, 45*time.Second, func() error {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		defer rcancel()
		rep, err := replication.Report(rctx, js)
		if err != nil {
			return nil // the meta group has no majority either: nothing can be listed, which status says
		}
		for _, r := range rep {
			if r.Quorum {
				return fmt.Errorf("%s is reported with quorum with two of three servers down: %+v", r.Name, r)
			}
		}
		return nil
	})
}

// TestKeeper_OnlyTheHolder: a keeper whose node does not hold the controller's seat changes
// nothing; once it does, it brings every stream to the target its count of servers gives.
func TestKeeper_OnlyTheHolder(t *testing.T) {
	servers := testbed.JetStreamCluster(t, 3)
	_, js := testbed.Connect(t, servers[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := ensure.Stream(ctx, js, jetstream.StreamConfig{Name: "DEAD", Subjects: []string{"dead.>"}, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	var holds = make(chan bool, 1)
	holds <- false
	holding := func() bool { h := <-holds; holds <- h; return h }
	k := replication.Keeper{JS: js, Servers: func() int { return 3 }, Holds: holding, Recheck: time.Hour, Log: slog.New(slog.DiscardHandler)}
	kctx, kcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(kctx) }()
	defer func() { kcancel(); <-done }()
	replicasOf := func() int {
		s, err := js.Stream(ctx, "DEAD")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.Replicas
	}
	// Three ticks of the keeper, not holding: still one copy.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if r := replicasOf(); r != 1 {
			t.Fatalf("a keeper that does not hold the controller's seat changed DEAD to %d copies", r)
		}
		time.Sleep(200 * time.Millisecond)
	}
	<-holds
	holds <- true
	testbed.RetryUntil(t, 30*time.Second, func() error {
		if r := replicasOf(); r != 3 {
			return fmt.Errorf("DEAD has %d copies, want 3", r)
		}
		return nil
	})
}

// TestKeeper_UnknownCountChangesNothing: a holder whose count of servers is not known (its
// own JetStream switched off: the count reads 0) leaves every stream's copies as they are —
// not one copy, which cut a whole mesh down when a holder's disk filled.
func TestKeeper_UnknownCountChangesNothing(t *testing.T) {
	servers := testbed.JetStreamCluster(t, 3)
	_, js := testbed.Connect(t, servers[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := ensure.Stream(ctx, js, jetstream.StreamConfig{Name: "DEAD", Subjects: []string{"dead.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	var passes atomic.Int64
	k := replication.Keeper{JS: js, Servers: func() int { passes.Add(1); return 0 }, Holds: func() bool { return true },
		Recheck: time.Hour, Log: slog.New(slog.DiscardHandler)}
	kctx, kcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(kctx) }()
	testbed.RetryUntil(t, 10*time.Second, func() error {
		if n := passes.Load(); n < 3 {
			return fmt.Errorf("the keeper counted %d times, want 3", n)
		}
		return nil
	})
	kcancel()
	<-done
	s, err := js.Stream(ctx, "DEAD")
	if err != nil {
		t.Fatal(err)
	}
	if r := s.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("with its count unknown, the keeper changed DEAD to %d copies", r)
	}
}

// TestKnown: the count is the mesh's servers capped by JetStream's peers, and unknown (0)
// while this server's JetStream is off or a clustered server sees no peer.
func TestKnown(t *testing.T) {
	for _, tc := range []struct {
		servers, peers int
		clustered, on  bool
		want           int
	}{{5, 5, true, true, 5}, {5, 3, true, true, 3}, {1, 0, false, true, 1}, {5, 0, true, true, 0}, {5, 5, true, false, 0}} {
		if got := replication.Known(tc.servers, tc.peers, tc.clustered, tc.on); got != tc.want {
			t.Errorf("Known(%d, %d, %v, %v) = %d, want %d", tc.servers, tc.peers, tc.clustered, tc.on, got, tc.want)
		}
	}
}
