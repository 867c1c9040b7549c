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
