package node_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/sdk/dedupbolt"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDedup_SurvivesRestart: 1,000 events are each stored twice (two copies of one envelope
// under different Nats-Msg-Ids, as a retry after the broker's window would be), the second
// copies only after the consuming module restarted. With the durable dedup, each event is
// handled once; the in-memory one would handle the second copies again.
func TestDedup_SurvivesRestart(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.EmitRate = 0 // 1,000 at once from a raw client, which does not retry a refusal for its pace
	b := newBedAt(t, cfg)
	seedA, _ := b.register("module: a\nrequires: [mesh-bus]\nemits: [x]\n")
	seedB, _ := b.register("module: b\nrequires: [mesh-bus]\nconsumes: [a.x]\n")
	const n = 1000
	key := mustSigner(t, seedA)
	subject := manifest.EventSubject("a", "x")
	envs := make([]nats.Header, n)
	for i := range envs {
		envs[i], _ = envelope.Stamp(key, "a", "alpha", subject, []byte(fmt.Sprintf(`{"n":%d}`, i)), envelope.Options{})
	}
	// A bounded window (n is within it: no publish stalls) that says so rather than leaning on
	// the client's default of 4,000.
	js, _ := jetstream.New(b.raw(seedA, "a"), jetstream.WithPublishAsyncMaxPending(n))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	publish := func(copy string) {
		acks := make([]jetstream.PubAckFuture, 0, n)
		for i, h := range envs {
			h = maps.Clone(h)
			h.Set(nats.MsgIdHdr, copy+"."+h.Get(envelope.EventID))
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: manifest.AdmitSubject("a", subject), Header: h, Data: []byte(fmt.Sprintf(`{"n":%d}`, i))})
			if err != nil {
				t.Fatal(err)
			}
			acks = append(acks, f)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			t.Fatal("publishing did not complete")
		}
		for i, f := range acks {
			select {
			case err := <-f.Err():
				t.Fatalf("%s copy, event %d: %v", copy, i, err)
			default:
			}
		}
	}
	path := filepath.Join(t.TempDir(), "dedup.db")
	var mu sync.Mutex
	handled := map[string]int{}
	var total int
	// run starts b with the dedup file, waits until its consumer has nothing left and stops.
	run := func(want int) {
		d, err := dedupbolt.Open(path, 10*n)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		c, err := sdk.Connect(ctx, b.n.ClientURL(), seedB)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.On("a.x", d.Once("count", func(_ context.Context, e sdk.Event) error {
			mu.Lock()
			handled[e.ID]++
			total++
			mu.Unlock()
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		retryUntil(t, 30*time.Second, func() error {
			mu.Lock()
			got := total
			mu.Unlock()
			if got < want {
				return fmt.Errorf("%d handled, want %d", got, want)
			}
			return nil
		})
		consumerIdle(t, b, manifest.EventsStreamName, "b")
	}
	publish("first")
	run(n)
	publish("second") // stored while b is away
	run(n)
	mu.Lock()
	defer mu.Unlock()
	if total != n || len(handled) != n {
		t.Fatalf("%d handler runs for %d events, want %d once each", total, len(handled), n)
	}
	if got := eventsOn(t, b, subject); got != 2*n {
		t.Fatalf("EVENTS holds %d copies, want %d: the bed did not deliver each event twice", got, 2*n)
	}
}
