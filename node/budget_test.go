package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
)

// TestBudget_FullStoreKeepsSeats fills a small store with one module's events until EVENTS
// refuses more, then checks that the control plane lives on: the controller's and the
// vault's leases keep renewing, registration and the vault still write, and the emitter is
// told why its emit failed.
func TestBudget_FullStoreKeepsSeats(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.StoreMaxBytes = 64 << 20
	// The module's own quota (a quarter of EVENTS by default) would refuse its emits first,
	// as soon as the audit log has counted them: here EVENTS itself is to fill.
	cfg.ModuleEventsMaxBytes = cfg.StoreMaxBytes
	b := newBedAt(t, cfg)
	seed, _ := b.register("module: flood\nrequires: [mesh-bus]\nemits: [big]\n")
	c := b.client(seed)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events, err := b.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	limit := events.CachedInfo().Config.MaxBytes
	if limit <= 0 || limit > int64(cfg.StoreMaxBytes)/2 {
		t.Fatalf("EVENTS max bytes %d, want within half of the %d-byte store", limit, cfg.StoreMaxBytes)
	}
	payload := map[string]string{"fill": strings.Repeat("x", 512<<10)}
	var refused error
	for i := 0; i < 1000 && refused == nil; i++ {
		_, refused = c.Emit(ctx, "big", payload)
	}
	if refused == nil {
		t.Fatal("1000 emits of 512 KiB into a 64 MiB store: none refused")
	}
	if !strings.Contains(refused.Error(), "maximum bytes") {
		t.Errorf("a full EVENTS refused the emit with %q; want JetStream's maximum-bytes refusal", refused)
	}

	// Every lease renews after the store filled: a renewal bumps the lease's revision.
	leases, err := b.js.KeyValue(ctx, seats.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, seat := range []string{manifest.ControllerSeat, manifest.VaultSeat} {
		e, err := leases.Get(ctx, seat)
		if err != nil {
			t.Fatalf("lease %s: %v", seat, err)
		}
		rev := e.Revision()
		retryUntil(t, 4*seats.DefaultTTL, func() error {
			e, err := leases.Get(ctx, seat)
			if err != nil {
				return fmt.Errorf("lease %s: %w", seat, err)
			}
			if e.Revision() <= rev {
				return fmt.Errorf("lease %s not renewed since the store filled (revision %d)", seat, rev)
			}
			return nil
		})
	}
	// The registry and the vault still write.
	b.register("module: later\nrequires: [mesh-bus]\nsecrets: [key]\n")
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "later", Name: "key"}, nil); err != nil {
		t.Fatalf("vault mint with EVENTS full: %v", err)
	}
	var status []api.SeatStatus
	for _, s := range seatList(t, b) {
		if s.Seat == manifest.ControllerSeat || s.Seat == manifest.VaultSeat {
			status = append(status, s)
		}
	}
	for _, s := range status {
		if s.Holder == "" {
			t.Errorf("seat %s lost its holder while the store was full", s.Seat)
		}
	}
}

// TestBudget_Config: the store limits are sizes with units, and a budget that leaves the
// control plane no room is refused.
func TestBudget_Config(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want config.Bytes
	}{{"512MiB", 512 << 20}, {"10GB", 10e9}, {"4096", 4096}, {"1G", 1 << 30}} {
		if got, err := config.ParseBytes(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"-1", "1.5GiB", "lots", "99999999999TiB"} {
		if _, err := config.ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.StoreMaxBytes = 64 << 20
	cfg.EventsMaxBytes = 60 << 20
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "control plane") {
		t.Errorf("events-max-bytes 60MiB of a 64MiB store: %v, want refused", err)
	}
}

func seatList(t *testing.T, b *bed) []api.SeatStatus {
	t.Helper()
	list, err := askSeats(b)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// askSeats is seatList for a retry loop: no controller answering (its seat changing hands)
// is an error to try again on, not the test's end.
func askSeats(b *bed) ([]api.SeatStatus, error) {
	m, err := b.op.Request(api.SeatListSubject, []byte("{}"), 5*time.Second)
	if err != nil {
		return nil, err
	}
	var r api.SeatListReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, err
	}
	return r.Seats, nil
}

// TestBudget_ManySeats: a small store still takes more than a dozen seats' queues (the 1 MiB
// floor each), and the registration of the one that does not fit is refused, before any of
// it is made, saying the room left and what to change.
func TestBudget_ManySeats(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.StoreMaxBytes = 64 << 20
	b := newBedAt(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var refused error
	n := 0 // seats registered
	for n < 40 {
		if _, refused = admin.Register(ctx, b.op, []byte(fmt.Sprintf("module: m%d\nrequires: [mesh-bus]\nseats:\n  s%d: {scope: mesh, retain: 1h, accepts: [run]}\n", n, n))); refused != nil {
			break
		}
		n++
	}
	if n < 15 {
		t.Fatalf("a 64 MiB store took only %d seats' queues: %v", n, refused)
	}
	if refused == nil || !strings.Contains(refused.Error(), "store-max-bytes") || !strings.Contains(refused.Error(), "is left") {
		t.Errorf("the seat that does not fit is refused with %v; want the room left and what to do", refused)
	}
	t.Logf("a 64 MiB store took %d seats' queues (refused: %v)", n, refused)
}
