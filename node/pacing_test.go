package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// floodBedAt is a bed whose first bar lasts bar, with flood-rate at rate.
func floodBedAt(t *testing.T, bar time.Duration, rate int) *bed {
	t.Helper()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.FloodBar, cfg.FloodBarMax, cfg.FloodRate = config.Duration(bar), config.Duration(4*bar), rate
	return newBedAt(t, cfg)
}

// flooder connects a module's key as a plain client that stays down once disconnected.
func flooder(t *testing.T, b *bed, seed, module string) (*nats.Conn, chan struct{}) {
	t.Helper()
	closed := make(chan struct{})
	nc := connect(t, b.n.ClientURL(), seed, nats.CustomInboxPrefix(manifest.InboxPrefix(module)), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	t.Cleanup(nc.Close)
	return nc, closed
}

// floodUntil publishes on subject (a request, with reply), as fast as the connection goes,
// until it is closed.
func floodUntil(t *testing.T, nc *nats.Conn, closed <-chan struct{}, subject, reply string, body []byte) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case <-closed:
			return
		case <-deadline:
			t.Fatal("the flooder is still connected after 20 s of flooding")
		default:
		}
		for range 100 {
			if reply == "" {
				nc.Publish(subject, body)
			} else {
				nc.PublishRequest(subject, reply, body)
			}
		}
		nc.Flush()
	}
}

// connectAs tries one connect with a module's seed.
func connectAs(b *bed, seed string) error {
	opt, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(b.n.ClientURL(), opt, nats.NoReconnect(), nats.Timeout(5*time.Second))
	if err == nil {
		nc.Close()
	}
	return err
}

// barredAndBack: after a flood the module's connects are refused, then admitted once the
// bar ends; the bar is counted in the metrics.
func barredAndBack(t *testing.T, b *bed, seed, reason string) {
	t.Helper()
	if err := connectAs(b, seed); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("the flooder's reconnect during its bar: %v, want refused", err)
	}
	retryUntil(t, 20*time.Second, func() error { return connectAs(b, seed) })
	if n := counter(scrape(t, b.n.HTTPURL()), "meshnode_flood_bars_total", "reason", reason); n < 1 {
		t.Fatalf("meshnode_flood_bars_total{reason=%q} = %v after a bar", reason, n)
	}
}

// TestPacing_RefusedFlooderIsBarred: a module flooding whoami far past its rate limit is
// disconnected, its reconnects are refused during its bar, and it is admitted again after
// it; another module stays connected throughout.
func TestPacing_RefusedFlooderIsBarred(t *testing.T) {
	t.Parallel()
	b := floodBedAt(t, 3*time.Second, 0) // the gates alone: the connections' rates unwatched
	seed, reg := b.register("module: attacker\nrequires: [mesh-bus]\n")
	otherSeed, _ := b.register("module: other\nrequires: [mesh-bus]\n")
	other := b.raw(otherSeed, "other")
	nc, closed := flooder(t, b, seed, "attacker")
	body, _ := json.Marshal(api.WhoamiRequest{PublicKey: reg.PublicKey})
	floodUntil(t, nc, closed, api.WhoamiSubject(reg.PublicKey), api.BootstrapInbox(reg.PublicKey)+".x", body)
	barredAndBack(t, b, seed, "refused")
	if !other.IsConnected() {
		t.Fatalf("another module's connection was closed with the flooder's: %v", other.LastError())
	}
	// Reported once, with the count that gave it away.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := b.js.OrderedConsumer(ctx, manifest.EventsStreamName, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{manifest.NodeEventSubject("alpha", "flood-barred")}})
	if err != nil {
		t.Fatal(err)
	}
	var bars []map[string]any
	for {
		m, err := c.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			break // none within a second of the last: the bar was long reported
		}
		var body map[string]any
		if err := json.Unmarshal(m.Data(), &body); err != nil {
			t.Fatalf("a flood-barred event of %q: %v", m.Data(), err)
		}
		bars = append(bars, body)
	}
	if len(bars) != 1 || bars[0]["module"] != "attacker" || bars[0]["reason"] != "refused" || bars[0]["count"].(float64) <= 2000 {
		t.Fatalf("flood-barred events %v, want one naming the attacker, its reason and more than 2,000 refusals", bars)
	}
}

// TestPacing_FastConnectionIsBarred: a module sending far more messages a second than
// flood-rate, on a path no rate limit guards (tool calls to a seat nobody holds), is barred
// the same way.
func TestPacing_FastConnectionIsBarred(t *testing.T) {
	t.Parallel()
	b := floodBedAt(t, 3*time.Second, 2000)
	b.register(protocolMailer)
	seed, _ := b.register("module: attacker\nrequires: [mesh-bus]\nuses: [mailer]\n")
	nc, closed := flooder(t, b, seed, "attacker")
	floodUntil(t, nc, closed, manifest.SeatToolSubject("mailer", "status"), manifest.InboxPrefix("attacker")+".x", nil)
	barredAndBack(t, b, seed, "rate")
}

// TestPacing_DeniedFlooderIsBarred: a module that keeps publishing what its permissions deny
// (host reports, which only a node may send) is barred for it, with the connections' rates
// unwatched: each denied publish is counted where the bus logs it.
func TestPacing_DeniedFlooderIsBarred(t *testing.T) {
	t.Parallel()
	b := floodBedAt(t, 3*time.Second, 0)
	seed, _ := b.register("module: attacker\nrequires: [mesh-bus]\nuses: [mesh-controller]\n")
	nc, closed := flooder(t, b, seed, "attacker")
	floodUntil(t, nc, closed, manifest.SeatAcceptSubject(manifest.ControllerSeat, "report"), "", []byte(`{}`))
	barredAndBack(t, b, seed, "denied")
}

// TestPacing_SteadyModuleIsNotBarred: a module working steadily under flood-rate stays
// connected.
func TestPacing_SteadyModuleIsNotBarred(t *testing.T) {
	t.Parallel()
	b := floodBedAt(t, 3*time.Second, 2000)
	b.register(protocolMailer)
	seed, _ := b.register("module: steady\nrequires: [mesh-bus]\nuses: [mailer]\n")
	nc, closed := flooder(t, b, seed, "steady")
	for range 30 { // 3 s at 1,000 a second
		for range 100 {
			nc.PublishRequest(manifest.SeatToolSubject("mailer", "status"), manifest.InboxPrefix("steady")+".x", nil)
		}
		nc.Flush()
		time.Sleep(100 * time.Millisecond) // the pace of the work, not a wait for a state
	}
	select {
	case <-closed:
		t.Fatalf("a module at half of flood-rate was disconnected: %v", nc.LastError())
	default:
	}
	if err := connectAs(b, seed); err != nil {
		t.Fatalf("a steady module's connect: %v", err)
	}
}
