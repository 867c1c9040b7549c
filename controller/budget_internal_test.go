package controller

import (
	"fmt"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/manifest"
)

// TestBudget_CheckDead: DEAD holds a share for each consumer; the registration that adds one
// past them is refused naming the numbers and what to change, and one that adds none passes.
func TestBudget_CheckDead(t *testing.T) {
	b := NewBudget(64<<20, config.Config{}) // DEAD a tenth: 6.4 MiB, a share the 64 KiB floor
	if got, want := b.DeadShare, int64(64<<10); got != want {
		t.Fatalf("default share of a 64 MiB store's DEAD = %d, want %d", got, want)
	}
	fits := int(b.Dead / b.DeadShare)
	if err := b.CheckDead("shop", fits, fits-1); err != nil {
		t.Errorf("the last consumer DEAD has a share for: %v", err)
	}
	err := b.CheckDead("shop", fits+1, fits)
	if err == nil {
		t.Fatalf("consumer %d of %d shares: not refused", fits+1, fits)
	}
	for _, want := range []string{"shop", fmt.Sprintf("%d consumers", fits+1), "64KiB", "dead-max-bytes-per-consumer", "raise dead-max-bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if err := b.CheckDead("shop", fits+5, fits+5); err != nil {
		t.Errorf("registered again with no new consumer, on a mesh already over: %v", err)
	}
	b = NewBudget(64<<20, config.Config{DeadMaxBytes: 4 << 20, DeadMaxBytesPerConsumer: 1 << 20})
	if b.Dead != 4<<20 || b.DeadShare != 1<<20 {
		t.Errorf("configured DEAD %d, share %d; want 4 MiB and 1 MiB", b.Dead, b.DeadShare)
	}
}

// TestDeadConsumers: a module's consumers whose letters DEAD keeps are its EVENTS consumer and
// its seats' that accept work, a node-scoped seat's once per node.
func TestDeadConsumers(t *testing.T) {
	m, err := manifest.Parse([]byte("module: mailer\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\n" +
		"seats:\n  mail: {scope: mesh, retain: 1h, accepts: [send]}\n  poll: {scope: node, retain: 1h, accepts: [run]}\n  quiet: {scope: mesh, serves: [ping]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.Derive()
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]struct{}{}
	deadConsumers(set, d, []string{"alpha", "beta"})
	deadConsumers(set, d, []string{"alpha", "beta"}) // counted once however often it is seen
	for _, want := range []string{"EVENTS/mailer", "SEAT_mail/seat-mail", "SEAT_poll/seat-poll-alpha", "SEAT_poll/seat-poll-beta"} {
		if _, ok := set[want]; !ok {
			t.Errorf("consumers %v: no %s", set, want)
		}
	}
	if len(set) != 4 {
		t.Errorf("consumers %v, want 4", set)
	}
}

// TestBudget_SeatDefault: a seat that declares no backlog reserves a 1024th of the seats'
// room, between 1 and 16 MiB, so about a thousand default seats fit on any store from a few
// GiB; seat-max-bytes sets it.
func TestBudget_SeatDefault(t *testing.T) {
	for _, tc := range []struct {
		store int64
		want  int64
	}{
		{64 << 20, 1 << 20},  // the floor: one job of the bus's largest
		{8 << 30, 2 << 20},   // a 1024th of the room, in whole MiB
		{57 << 30, 16 << 20}, // the store of issue 37's bench: the cap
		{1 << 40, 16 << 20},
	} {
		b := NewBudget(tc.store, config.Config{})
		if b.Seat < tc.want || b.Seat >= tc.want+1<<20 {
			t.Errorf("store %s: a default seat reserves %s, want %s", config.Bytes(tc.store), config.Bytes(b.Seat), config.Bytes(tc.want))
		}
		if sum := b.Registry + b.Leases + b.Vault + b.State + b.Events + b.Dead + b.Provision + b.Seats; sum > tc.store {
			t.Errorf("store %s: the budget hands out %s", config.Bytes(tc.store), config.Bytes(sum))
		}
	}
	if got, want := NewBudget(57<<30, config.Config{SeatMaxBytes: 4 << 20}).Seat, int64(4<<20); got != want {
		t.Errorf("seat-max-bytes 4MiB: a default seat reserves %d, want %d", got, want)
	}
}

// seatModule is a module with one seat that accepts work, declaring backlog when not empty.
func seatModule(t testing.TB, module, backlog string) *manifest.Derivation {
	t.Helper()
	seat := "{scope: mesh, retain: 7d, accepts: [run]}"
	if backlog != "" {
		seat = "{scope: mesh, retain: 7d, backlog: " + backlog + ", accepts: [run]}"
	}
	m, err := manifest.Parse([]byte("module: " + module + "\nrequires: [mesh-bus]\nseats:\n  " + module + "-q: " + seat + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.Derive()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestBudget_CheckSeats: the seats' queues together reserve at most what the store leaves
// them; the registration that would pass it is refused naming the module, its seats and
// their sizes, the room left and what to change, and one that reserves no more than before
// passes.
func TestBudget_CheckSeats(t *testing.T) {
	b := NewBudget(1<<30, config.Config{})
	big := seatModule(t, "big", "64MiB")
	if got, want := b.SeatsOf(big), int64(64<<20); got != want {
		t.Fatalf("a seat declaring 64MiB reserves %d, want %d", got, want)
	}
	if got := b.SeatsOf(seatModule(t, "small", "")); got != b.Seat {
		t.Fatalf("a seat declaring no backlog reserves %d, want the default %d", got, b.Seat)
	}
	others := b.Seats - 63<<20 // 63 MiB left
	if err := b.CheckSeats("big", seatModule(t, "big", "63MiB"), others, 0); err != nil {
		t.Errorf("a seat of exactly the room left: %v", err)
	}
	err := b.CheckSeats("big", big, others, 0)
	if err == nil {
		t.Fatal("a 64MiB seat with 63MiB left: not refused")
	}
	for _, want := range []string{"module big", "seat big-q 64MiB", "63MiB is left", "backlog:", "store-max-bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if err := b.CheckSeats("big", big, b.Seats, 64<<20); err != nil {
		t.Errorf("registered again as it was, on a mesh already full: %v", err)
	}
	if err := b.CheckSeats("big", seatModule(t, "big", "32MiB"), b.Seats+1, 64<<20); err != nil {
		t.Errorf("a smaller backlog on a mesh over its room: %v", err)
	}
	if err := b.CheckSeats("big", seatModule(t, "big", ""), b.Seats, 0); err == nil || !strings.Contains(err.Error(), "the default, seat-max-bytes") {
		t.Errorf("a default seat past the room: %v, want refused naming the default", err)
	}
}

// TestBudget_TenThousandModules is issue 37's acceptance at the budget: 10,000 modules of
// which 1,000 declare a seat (one in ten of those a 64 MiB backlog, the rest the default)
// register one after the other on the store of a 57 GiB disk's default, each checked as the
// controller checks it (checkSeats: the mesh's seats and every registered module's).
func TestBudget_TenThousandModules(t *testing.T) {
	b := NewBudget(57<<30, config.Config{})
	others := b.SeatsOf(manifest.Builtin())
	plain, err := manifest.Parse([]byte("module: plain\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\n"))
	if err != nil {
		t.Fatal(err)
	}
	pd, err := plain.Derive()
	if err != nil {
		t.Fatal(err)
	}
	seats := 0
	for i := range 10_000 {
		module, d := fmt.Sprintf("m%d", i), pd
		if i%10 == 0 {
			backlog := ""
			if i%100 == 0 {
				backlog = "64MiB"
			}
			d, seats = seatModule(t, module, backlog), seats+1
		}
		if err := b.CheckSeats(module, d, others, 0); err != nil {
			t.Fatalf("module %d of 10,000 (%d seats): %v", i+1, seats, err)
		}
		others += b.SeatsOf(d)
	}
	if seats != 1000 {
		t.Fatalf("%d seats, want 1,000", seats)
	}
	t.Logf("1,000 seats reserve %s of the %s the 57GiB store gives seat queues", config.Bytes(others), config.Bytes(b.Seats))
}
