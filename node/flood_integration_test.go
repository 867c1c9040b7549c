//go:build integration

package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// The flood beds: seconds of flooding each, so they run in CI's integration step
// (go test -tags integration -run '^TestIntegration'), not in the fast tier.

// p99 is the 99th percentile of ds (the largest of fewer than 100).
func p99(ds []time.Duration) time.Duration { return percentile(ds, 99) }

// flood runs n calls of f from workers goroutines, until done or ctx ends; it returns how
// many succeeded and when the last one ended.
func flood(ctx context.Context, n, workers int, f func(ctx context.Context) error) (ok int64, took time.Duration) {
	start := time.Now()
	var next, good atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				if f(ctx) == nil {
					good.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return good.Load(), time.Since(start)
}

// victimRun times n calls of op one after another; every call must succeed.
func victimRun(t *testing.T, n int, op func(ctx context.Context) error) []time.Duration {
	t.Helper()
	var out []time.Duration
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		start := time.Now()
		err := op(ctx)
		out = append(out, time.Since(start))
		cancel()
		if err != nil {
			t.Errorf("victim operation %d of %d: %v", i+1, n, err)
		}
	}
	return out
}

// underFlood runs the flood and the victim's operations at once and reports the victim's
// timings and how many of them ended while the flood was still going.
func underFlood(t *testing.T, b *bed, n int, attack func(ctx context.Context) error, victims int, op func(ctx context.Context) error) (times []time.Duration, overlapped int, answered int64, took time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		answered, took = flood(ctx, n, 32, attack)
	}()
	for range victims {
		vctx, vcancel := context.WithTimeout(context.Background(), 15*time.Second)
		start := time.Now()
		err := op(vctx)
		times = append(times, time.Since(start))
		vcancel()
		if err != nil {
			t.Errorf("victim operation under the flood: %v", err)
		}
		select {
		case <-floodDone:
		default:
			overlapped++
		}
		if code, body := httpGet(t, b.n.HTTPURL()+"/readyz"); code != http.StatusOK {
			t.Errorf("/readyz=%d %s under the flood", code, body)
		}
	}
	<-floodDone
	return times, overlapped, answered, took
}

// TestIntegration_WhoamiFlood: 2,000 whoami requests from one module as fast as it can while
// another module connects 20 times: every connect succeeds and the node stays ready. The
// ratio of the p99s is logged, not asserted (the rate limits' bed asserts it).
func TestIntegration_WhoamiFlood(t *testing.T) {
	b := newBed(t)
	seed, attacker := b.register("module: attacker\nrequires: [mesh-bus]\n")
	victimSeed, _ := b.register("module: victim\nrequires: [mesh-bus]\n")
	nc := b.raw(seed, "attacker")
	body, _ := json.Marshal(api.WhoamiRequest{PublicKey: attacker.PublicKey})
	attack := func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := nc.RequestWithContext(rctx, api.WhoamiSubject(attacker.PublicKey), body)
		return err
	}
	connect := func(ctx context.Context) error {
		c, err := sdk.Connect(ctx, b.n.ClientURL(), victimSeed)
		if err != nil {
			return err
		}
		return c.Close()
	}
	idle := victimRun(t, 20, connect)
	times, overlapped, answered, took := underFlood(t, b, 2000, attack, 20, connect)
	t.Logf("connect p99: idle %v, under a whoami flood %v (%d of 20 during the flood; the flood: %d of 2000 answered in %v)",
		p99(idle), p99(times), overlapped, answered, took.Round(time.Millisecond))
	if code, body := httpGet(t, b.n.HTTPURL()+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz=%d %s after the flood", code, body)
	}
}

// TestIntegration_VaultFlood: 2,000 fetches of its own secret from one module while another
// module fetches its own 20 times: every fetch of the victim succeeds, with the right value.
func TestIntegration_VaultFlood(t *testing.T) {
	b := newBed(t)
	seed, _ := b.register("module: attacker\nrequires: [mesh-bus]\nsecrets: [tok]\n")
	victimSeed, _ := b.register("module: victim\nrequires: [mesh-bus]\nsecrets: [key]\n")
	for _, r := range []api.VaultRequest{{Owner: "attacker", Name: "tok"}, {Owner: "victim", Name: "key"}} {
		if _, err := b.vault(api.VaultVerbMint, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	var want api.Secret
	if _, err := b.vault(api.VaultVerbFetch, api.VaultRequest{Owner: "victim", Name: "key"}, &want); err != nil || want.Value == "" {
		t.Fatalf("the operator fetches the victim's secret: %v", err)
	}
	nc := b.raw(seed, "attacker")
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	body, _ := json.Marshal(api.VaultRequest{XKey: xpub, Name: "tok"})
	attack := func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := nc.RequestWithContext(rctx, api.VaultToolSubject(api.VaultVerbFetch, api.VaultModuleCaller("attacker")), body)
		return err
	}
	vc := b.client(victimSeed)
	fetch := func(ctx context.Context) error {
		v, err := vc.Secret(ctx, "key")
		if err == nil && v != want.Value {
			err = fmt.Errorf("fetched %q, want the minted value", v)
		}
		return err
	}
	idle := victimRun(t, 20, fetch)
	times, overlapped, answered, took := underFlood(t, b, 2000, attack, 20, fetch)
	t.Logf("fetch p99: idle %v, under a vault flood %v (%d of 20 during the flood; the flood: %d of 2000 answered in %v)",
		p99(idle), p99(times), overlapped, answered, took.Round(time.Millisecond))
	if code, body := httpGet(t, b.n.HTTPURL()+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz=%d %s after the flood", code, body)
	}
}

// TestIntegration_FloodOthersServed: while one module floods whoami, the vault (including a secret it
// does not declare) and emits, another module's connects, fetches and emits all succeed;
// the attacker is rate limited, and its refusals are recorded as a few counted events, not
// one event per request.
func TestIntegration_FloodOthersServed(t *testing.T) {
	f := newFloodBed(t)
	ops := f.victimOps(t)
	stop := make(chan struct{})
	done := f.flood(t, stop)
	for _, name := range []string{"connect", "fetch", "emit"} {
		for i := range 20 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := ops[name](ctx)
			cancel()
			if err != nil {
				close(stop)
				done()
				t.Fatalf("victim %s %d under flood: %v", name, i+1, err)
			}
		}
	}
	close(stop)
	sent := done()
	t.Logf("the attacker sent %d requests and emits", sent)
	if code, body := httpGet(t, f.b.n.HTTPURL()+"/readyz"); code != 200 {
		t.Fatalf("/readyz %d after the flood: %s", code, body)
	}

	// The refusals arrive as counted events: at most one per identity, tool and interval.
	op := f.b.operatorConn()
	defer op.Close()
	js, _ := jetstream.New(op)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events, err := js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	var total, count int
	retryUntil(t, 25*time.Second, func() error {
		total, count = 0, 0
		msgs, err := readRefusals(ctx, events)
		if err != nil {
			return err
		}
		total = len(msgs)
		for _, m := range msgs {
			count += m
		}
		if count == 0 {
			return fmt.Errorf("no refusal recorded yet (%d events)", total)
		}
		return nil
	})
	t.Logf("%d refused-events recorded %d refusals", total, count)
	if total > 20 {
		t.Errorf("%d refusal events for one flood of a few seconds: refusals are not aggregated", total)
	}
}

// readRefusals returns the count field of every refused event in EVENTS.
func readRefusals(ctx context.Context, events jetstream.Stream) ([]int, error) {
	var out []int
	for _, subject := range []string{manifest.NodeEventSubject("alpha", "refused"), api.VaultEventSubject("refused")} {
		c, err := events.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
		if err != nil {
			return nil, err
		}
		for {
			m, err := c.Next(jetstream.FetchMaxWait(200 * time.Millisecond))
			if err != nil {
				break
			}
			var body struct {
				Count int `json:"count"`
			}
			if json.Unmarshal(m.Data(), &body) == nil {
				out = append(out, body.Count)
			}
		}
	}
	return out, nil
}
