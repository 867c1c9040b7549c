package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sdk"
)

// readyz returns /readyz's status code and reason.
func readyz(t *testing.T, n *runningNode) (int, string) {
	t.Helper()
	code, body := httpGet(t, n.HTTPURL()+"/readyz")
	var r struct {
		Reason string `json:"reason"`
	}
	json.Unmarshal([]byte(body), &r)
	return code, r.Reason
}

// TestDrift_StreamsAreRecreated: a deleted EVENTS stream or module consumer is made again
// within seconds (a deletion advisory triggers the check), and emits flow again.
func TestDrift_StreamsAreRecreated(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: shop\nrequires: [mesh-bus]\nemits: [sold]\nconsumes: [shop.sold]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.js.DeleteStream(ctx, manifest.EventsStreamName); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 15*time.Second, func() error {
		if _, err := b.js.Stream(ctx, manifest.EventsStreamName); err != nil {
			return fmt.Errorf("EVENTS not recreated: %w", err)
		}
		if _, err := b.js.Consumer(ctx, manifest.EventsStreamName, "shop"); err != nil {
			return fmt.Errorf("shop's consumer not recreated: %w", err)
		}
		return nil
	})
	c := b.client(seed)
	if _, err := c.Emit(ctx, "sold", map[string]int{"n": 1}); err != nil {
		t.Fatalf("emit after EVENTS was recreated: %v", err)
	}
	if code, reason := readyz(t, b.n); code != 200 {
		t.Fatalf("/readyz %d after a repair: %s", code, reason)
	}
}

// TestDrift_LostRegistryIsAnAlarm: a deleted registry is not an empty mesh. /readyz says 503
// naming it while the node runs, and again after a restart that made the bucket anew, empty;
// the operator's accept-loss clears it.
func TestDrift_LostRegistryIsAnAlarm(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	b := newBedAt(t, cfg)
	b.register("module: shop\nrequires: [mesh-bus]\nemits: [sold]\n")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.js.DeleteKeyValue(ctx, registry.Bucket); err != nil {
		t.Fatal(err)
	}
	wantAlarm := func(n *runningNode) {
		retryUntil(t, 15*time.Second, func() error {
			code, reason := readyz(t, n)
			if code != 503 || !strings.Contains(reason, registry.Bucket) || !strings.Contains(reason, "accept-loss") {
				return fmt.Errorf("/readyz %d %q, want 503 naming %s and what to do", code, reason, registry.Bucket)
			}
			return nil
		})
	}
	wantAlarm(b.n)

	b.close()
	b = newBedAt(t, cfg)
	wantAlarm(b.n) // made again at start, empty: still lost

	var reply api.ClusterReply
	body, _ := json.Marshal(api.AcceptLossRequest{Bucket: registry.Bucket})
	m, err := b.op.Request(manifest.NodeToolSubject("alpha", api.NodeToolAcceptLoss), body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(m.Data, &reply); err != nil || !reply.OK {
		t.Fatalf("accept-loss: %s, %v", m.Data, err)
	}
	retryUntil(t, 15*time.Second, func() error {
		if code, reason := readyz(t, b.n); code != 200 {
			return fmt.Errorf("/readyz %d %q after accept-loss", code, reason)
		}
		return nil
	})
	// A bucket that is not the registry's or the vault's is refused.
	body, _ = json.Marshal(api.AcceptLossRequest{Bucket: "mesh-seats"})
	m, err = b.op.Request(manifest.NodeToolSubject("alpha", api.NodeToolAcceptLoss), body, 10*time.Second)
	if err != nil || json.Unmarshal(m.Data, &reply) != nil || reply.OK {
		t.Fatalf("accept-loss of mesh-seats: %v %+v, want refused", err, reply)
	}
}

// TestNode_StartWatchdog: a start whose heap passes the limit is reported, with the store,
// through the node's OnStartMemory (the binary exits there).
func TestNode_StartWatchdog(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	n := node.New(cfg, nil)
	n.CreateIdentity = true
	n.StartMemoryLimit = 1
	got := make(chan error, 1)
	n.OnStartMemory = func(err error) {
		select {
		case got <- err:
		default:
		}
	}
	if err := n.Open(); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	select {
	case err := <-got:
		var mem *embedbus.ErrStartMemory
		if !errors.As(err, &mem) || !strings.Contains(err.Error(), cfg.DataDir) {
			t.Fatalf("OnStartMemory(%v), want an ErrStartMemory naming the data dir", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a 1-byte start memory limit did not reach OnStartMemory")
	}
}

// TestDrift_BadRecordsAreReported: a record the registry refuses is skipped, and /readyz says
// so, naming the key and what to do, until a registration replaces it.
func TestDrift_BadRecordsAreReported(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.DriftInterval = config.Duration(time.Second) // the periodic check: no advisory announces this
	b := newBedAt(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := b.js.KeyValue(ctx, registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "module.ghost", []byte("not a record")); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 25*time.Second, func() error {
		code, reason := readyz(t, b.n)
		if code != 503 || !strings.Contains(reason, "module.ghost") || !strings.Contains(reason, "register") {
			return fmt.Errorf("/readyz %d %q, want 503 naming module.ghost and what to do", code, reason)
		}
		return nil
	})
	b.register("module: ghost\nrequires: [mesh-bus]\n")
	retryUntil(t, 25*time.Second, func() error {
		if code, reason := readyz(t, b.n); code != 200 {
			return fmt.Errorf("/readyz %d %q after the record was replaced", code, reason)
		}
		return nil
	})
}

// TestDrift_LeasesBucketIsRecreated: a deleted leases bucket is made again (nothing is lost:
// leases are renewed every second), and the mesh's seats are held again.
func TestDrift_LeasesBucketIsRecreated(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.DriftInterval = config.Duration(time.Second) // the periodic check: no advisory announces this
	b := newBedAt(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.js.DeleteKeyValue(ctx, "mesh-seats"); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 30*time.Second, func() error {
		kv, err := b.js.KeyValue(ctx, "mesh-seats")
		if err != nil {
			return fmt.Errorf("mesh-seats not recreated: %w", err)
		}
		// The lease is in the new bucket, and the node's mirror shows that one: its epoch is
		// a revision of the new bucket, not the deleted one's.
		e, err := kv.Get(ctx, manifest.ControllerSeat)
		if err != nil {
			return fmt.Errorf("%s's lease is not in the new bucket: %w", manifest.ControllerSeat, err)
		}
		var l struct {
			Epoch uint64 `json:"epoch"`
		}
		json.Unmarshal(e.Value(), &l)
		if l.Epoch == 0 {
			l.Epoch = e.Revision()
		}
		list, err := askSeats(b)
		if err != nil {
			return fmt.Errorf("seat list: %w", err)
		}
		for _, s := range list {
			if s.Seat == manifest.ControllerSeat && (s.Holder == "" || s.Epoch != l.Epoch) {
				return fmt.Errorf("%s: the mirror shows holder %q epoch %d, the new bucket epoch %d", s.Seat, s.Holder, s.Epoch, l.Epoch)
			}
		}
		if code, reason := readyz(t, b.n); code != 200 {
			return fmt.Errorf("/readyz %d %q", code, reason)
		}
		return nil
	})
}

// TestDrift_AuditGoesOnAfterItsConsumerIsRecreated: the audit consumer deleted, the node
// makes it again, and the audit log goes on recording: the logger finds its consumer again.
func TestDrift_AuditGoesOnAfterItsConsumerIsRecreated(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: shop\nrequires: [mesh-bus]\nemits: [sold]\n")
	c := b.client(seed)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Emit(ctx, "sold", map[string]int{"n": 1}); err != nil {
		t.Fatal(err)
	}
	b.waitAudited(20 * time.Second)
	audit := manifest.AuditConsumer(b.n.Identity().Name).Name
	if err := b.js.DeleteConsumer(ctx, manifest.EventsStreamName, audit); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		_, err := b.js.Consumer(ctx, manifest.EventsStreamName, audit)
		return err
	})
	if _, err := c.Emit(ctx, "sold", map[string]int{"n": 2}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 30*time.Second, func() error {
		if n := len(b.auditAll("shop")); n != 2 {
			return fmt.Errorf("the audit log has %d of shop's 2 events", n)
		}
		return nil
	})
}

// TestDrift_ModuleConsumesAgainAfterItsConsumerIsRecreated: a running module's durable
// consumer deleted under it, the node makes it again, and the module — not restarted —
// handles the next event within 5 s of the consumer being back. nats.go ends a Consume
// whose consumer was deleted; an sdk that only logged that stayed deaf until restarted.
func TestDrift_ModuleConsumesAgainAfterItsConsumerIsRecreated(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: shop\nrequires: [mesh-bus]\nemits: [sold]\nconsumes: [shop.sold]\n")
	c := b.client(seed)
	got := make(chan int, 16)
	if err := c.On("shop.sold", func(_ context.Context, e sdk.Event) error {
		var body struct{ N int }
		json.Unmarshal(e.Data, &body)
		got <- body.N
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	emitAndReceive := func(n int, within time.Duration) {
		t.Helper()
		if _, err := c.Emit(ctx, "sold", map[string]int{"n": n}); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(within)
		for {
			select {
			case m := <-got:
				if m == n {
					return
				}
			case <-deadline:
				t.Fatalf("event %d not handled within %s", n, within)
			}
		}
	}
	emitAndReceive(1, 20*time.Second)
	for round := 2; round <= 3; round++ {
		if err := b.js.DeleteConsumer(ctx, manifest.EventsStreamName, "shop"); err != nil {
			t.Fatal(err)
		}
		retryUntil(t, 20*time.Second, func() error {
			_, err := b.js.Consumer(ctx, manifest.EventsStreamName, "shop")
			return err
		})
		emitAndReceive(round, 5*time.Second)
	}
}

// TestDrift_HolderServesAgainAfterItsQueueIsRecreated: a seat's work-queue stream deleted
// under its running holder, the node makes it and its consumer again, and the holder handles
// the next job within 5 s of the queue being back, without a restart.
func TestDrift_HolderServesAgainAfterItsQueueIsRecreated(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mailerSeed, _ := b.register(mailerManifest)
	shopSeed, _ := b.register(shopManifest)
	log := newJobLog()
	c := b.client(mailerSeed)
	if err := c.Accept("send", log.handler(c.Instance())); err != nil {
		t.Fatal(err)
	}
	holder(t, "mailer", c)
	shop := b.client(shopSeed)
	submit(t, shop, "mailer", "send", 1)
	retryUntil(t, 20*time.Second, func() error {
		if n := log.distinct(); n != 1 {
			return fmt.Errorf("%d of 1 job handled", n)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := b.js.DeleteStream(ctx, "SEAT_mailer"); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		_, err := b.js.Consumer(ctx, "SEAT_mailer", "seat-mailer")
		return err
	})
	submit(t, shop, "mailer", "send", 1)
	retryUntil(t, 5*time.Second, func() error {
		if n := log.distinct(); n != 2 {
			return fmt.Errorf("%d of 2 jobs handled", n)
		}
		return nil
	})
}

// TestDrift_RecreatedConsumerLosesNothing: a module's consumer deleted while events wait for
// it, and more emitted before the node makes it again: made again, it starts where it had
// acked to, so the module — connecting afterwards — handles every one of them. Made again at
// the stream's end (as a new consumer is), all five were skipped.
func TestDrift_RecreatedConsumerLosesNothing(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: shop\nrequires: [mesh-bus]\nemits: [sold]\nconsumes: [shop.sold]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	emitter := b.client(seed)
	for n := 1; n <= 3; n++ {
		if _, err := emitter.Emit(ctx, "sold", map[string]int{"n": n}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.js.DeleteConsumer(ctx, manifest.EventsStreamName, "shop"); err != nil {
		t.Fatal(err)
	}
	for n := 4; n <= 5; n++ {
		if _, err := emitter.Emit(ctx, "sold", map[string]int{"n": n}); err != nil {
			t.Fatal(err)
		}
	}
	retryUntil(t, 20*time.Second, func() error {
		_, err := b.js.Consumer(ctx, manifest.EventsStreamName, "shop")
		return err
	})
	var mu sync.Mutex
	got := map[int]bool{}
	if err := b.client(seed).On("shop.sold", func(_ context.Context, e sdk.Event) error {
		var body struct{ N int }
		json.Unmarshal(e.Data, &body)
		mu.Lock()
		got[body.N] = true
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 5 {
			return fmt.Errorf("handled %v, want events 1 to 5", got)
		}
		return nil
	})
}
