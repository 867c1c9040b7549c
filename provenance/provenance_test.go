package provenance_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/provenance"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats-server/v2/server"
)

// book is the leases a node saw of mesh-controller: n1 at epoch 5, until n2 took it at epoch
// 9, a minute ago.
type book struct{ ended time.Time }

func (book) LastHeld(string) (seats.Lease, bool) { return seats.Lease{Node: "n2", Epoch: 9}, true }
func (b book) HeldAt(_ string, epoch uint64) (seats.Lease, time.Time, bool) {
	switch epoch {
	case 5:
		return seats.Lease{Node: "n1", Epoch: 5}, b.ended, true
	case 9:
		return seats.Lease{Node: "n2", Epoch: 9}, time.Time{}, true
	}
	return seats.Lease{}, time.Time{}, false
}

// TestKey_ByTheLeaseTheEventNames: a node-held seat's event is judged by the node whose lease
// it names while that lease could still speak (stored within LateGrace of the next lease);
// after that, or naming no lease this node saw, by the holder now.
func TestKey_ByTheLeaseTheEventNames(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	reg := registry.New(nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := reg.Open(ctx, js, 1, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	for _, n := range []string{"n1", "n2"} {
		if err := reg.SetNode(ctx, n, registry.NodeIdentity{PublicKey: "key-" + n}); err != nil {
			t.Fatal(err)
		}
	}
	ended := time.Now().Add(-time.Minute)
	src := provenance.Sources{Node: "n3", NodeKey: "key-n3", Registry: reg, Leases: func() provenance.Leases { return book{ended} }}
	subject := manifest.SeatEventSubject(manifest.ControllerSeat, "provisioned")
	for _, tc := range []struct {
		name  string
		epoch uint64
		at    time.Time
		want  string
	}{
		{"the old holder's late event", 5, ended.Add(time.Second), "key-n1"},
		{"the old holder naming its lease long after", 5, ended.Add(provenance.LateGrace + time.Second), "key-n2"},
		{"the holder's own", 9, time.Now(), "key-n2"},
		{"an epoch this node never saw", 7, time.Now(), "key-n2"},
		{"no epoch (an older server)", 0, time.Now(), "key-n2"},
	} {
		if got, ok := src.Key(subject, manifest.ControllerSeat, tc.epoch, tc.at); !ok || got != tc.want {
			t.Errorf("%s: key %q %v, want %q", tc.name, got, ok, tc.want)
		}
	}
}

// TestUnsettled: an event of a node-held seat naming an epoch newer than any lease the node
// saw is unsettled (its signer not known yet); one naming a lease seen, an older epoch never
// seen, none, or a seat a module holds is not.
func TestUnsettled(t *testing.T) {
	src := provenance.Sources{Node: "n3", Leases: func() provenance.Leases { return book{time.Now()} }}
	controller := manifest.SeatEventSubject(manifest.ControllerSeat, "provisioned")
	for _, tc := range []struct {
		name            string
		subject, source string
		epoch           uint64
		want            bool
	}{
		{"the next holder's first event", controller, manifest.ControllerSeat, 10, true},
		{"the holder now", controller, manifest.ControllerSeat, 9, false},
		{"an older lease never seen", controller, manifest.ControllerSeat, 7, false},
		{"no epoch", controller, manifest.ControllerSeat, 0, false},
		{"a module's seat", manifest.SeatEventSubject("printer", "done"), "printer", 10, false},
		{"a source that does not own the subject", controller, "printer", 10, false},
	} {
		if got := src.Unsettled(tc.subject, tc.source, tc.epoch); got != tc.want {
			t.Errorf("%s: unsettled %v, want %v", tc.name, got, tc.want)
		}
	}
	if (provenance.Sources{}).Unsettled(controller, manifest.ControllerSeat, 10) {
		t.Error("a node that reads no leases (a site) called an event unsettled")
	}
}
