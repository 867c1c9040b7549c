package manifest_test

import (
	"testing"

	"github.com/meshnode/meshnode/manifest"
)

// TestSeat_Backlog: a declared backlog is the seat's work queue's MaxBytes, in every unit the
// key takes, whichever version accepts the work; a seat that declares none leaves it to the
// node (0), as does one with no queue.
func TestSeat_Backlog(t *testing.T) {
	for _, tc := range []struct {
		seat string
		want int64
	}{
		{"{scope: mesh, retain: 1d, backlog: 64MiB, accepts: [send]}", 64 << 20},
		{"{scope: node, retain: 1d, backlog: 1GB, accepts: [send]}", 1e9},
		{"{scope: mesh, retain: 1d, backlog: 1MiB, accepts: [send]}", manifest.MinBacklog},
		{"{scope: mesh, retain: 1d, backlog: 1TiB, accepts: [send]}", manifest.MaxBacklog},
		{"{scope: mesh, retain: 1d, backlog: 2GiB, serves: [status], versions: {v2: {accepts: [send]}}}", 2 << 30},
		{"{scope: mesh, retain: 1d, accepts: [send]}", 0},
	} {
		t.Run(tc.seat, func(t *testing.T) {
			m, err := manifest.Parse([]byte("module: m\nrequires: [mesh-bus]\nseats:\n  s: " + tc.seat + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			d, err := m.Derive()
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Seats) != 1 || d.Seats[0].Stream == nil {
				t.Fatalf("derived seats %+v, want one with a work queue", d.Seats)
			}
			if got := d.Seats[0].Stream.MaxBytes; got != tc.want {
				t.Errorf("SEAT_s MaxBytes = %d, want %d", got, tc.want)
			}
		})
	}
}
