package host

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/deploy"
)

// TestFollower_HoldsNow: a declaration at an older epoch than the applied one is taken only
// from the seat's holder now, at that epoch, composed after it took the lease — an epoch
// number a remade leases' bucket repeats does not revive a declaration composed before.
func TestFollower_HoldsNow(t *testing.T) {
	took := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	f := &Follower{cfg: Config{Holder: func() (string, uint64, time.Time, bool) { return "alpha", 3, took, true }}}
	for _, tc := range []struct {
		d    deploy.Declaration
		want bool
	}{
		{deploy.Declaration{Controller: "alpha", Epoch: 3, Composed: took.Add(time.Second)}, true},
		{deploy.Declaration{Controller: "alpha", Epoch: 3, Composed: took}, true},
		{deploy.Declaration{Controller: "alpha", Epoch: 3, Composed: took.Add(-time.Second)}, false}, // composed under an earlier lease of the same number
		{deploy.Declaration{Controller: "beta", Epoch: 3, Composed: took.Add(time.Second)}, false},
		{deploy.Declaration{Controller: "alpha", Epoch: 2, Composed: took.Add(time.Second)}, false},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond) // a refusal waits for the mirror until then
		if got := f.holdsNow(ctx, tc.d); got != tc.want {
			t.Errorf("holdsNow(%+v)=%v, want %v", tc.d, got, tc.want)
		}
		cancel()
	}
}
