package bench

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestPairs: the mesh's side and the floor's take turns going first, round after round; the
// ratio is the median of the rounds' (the lower middle for an even count), every round's kept
// in the order run; a side's failure names it and its round.
func TestPairs(t *testing.T) {
	for _, tc := range []struct {
		mesh, floor []float64 // events/s, a round each
		wantOrder   string
		wantRound   int
	}{
		{[]float64{80, 90, 85}, []float64{100, 100, 100}, "mf fm mf", 2},
		{[]float64{70, 95, 90, 80}, []float64{100, 100, 100, 100}, "mf fm mf fm", 3},
		{[]float64{50}, []float64{100}, "mf", 0},
	} {
		var order []string
		var round []string
		side := func(name string, rates []float64) func(context.Context, int) (Series, error) {
			i := 0
			return func(_ context.Context, n int) (Series, error) {
				if n != 7 {
					t.Errorf("a side sent %d events, want 7", n)
				}
				round = append(round, name)
				if len(round) == 2 {
					order, round = append(order, strings.Join(round, "")), nil
				}
				i++
				return Series{Count: n, PerSecond: rates[i-1]}, nil
			}
		}
		rs, err := pairs(context.Background(), len(tc.mesh), "mesh", side("m", tc.mesh), "floor", side("f", tc.floor), 7)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(order, " "); got != tc.wantOrder {
			t.Errorf("%v: ran %q, want %q", tc.mesh, got, tc.wantOrder)
		}
		_, _, r, all := rs.summary()
		want := make([]float64, len(tc.mesh))
		for i := range want {
			want[i] = tc.mesh[i] / tc.floor[i]
		}
		if !slices.Equal(all, want) {
			t.Errorf("rounds' ratios %v, want %v", all, want)
		}
		if r != want[tc.wantRound] {
			t.Errorf("%v: median ratio %v, want round %d's, %v", tc.mesh, r, tc.wantRound, want[tc.wantRound])
		}
	}

	failing := func(context.Context, int) (Series, error) { return Series{}, errors.New("stalled") }
	ok := func(_ context.Context, n int) (Series, error) { return Series{Count: n, PerSecond: 1}, nil }
	if _, err := pairs(context.Background(), 3, "mesh", ok, "floor", failing, 1); err == nil || !strings.Contains(err.Error(), "floor, round 1 of 3: stalled") {
		t.Errorf("a failing floor: %v, want it named with its round", err)
	}
}

// TestMedianSeries: each figure of a side's rounds is its own median, wherever the others
// come from; duplicates add up.
func TestMedianSeries(t *testing.T) {
	got := medianSeries([]Series{
		{Count: 5, PerSecond: 300, P50: 1, P99: 90, Duplicates: 1},
		{Count: 5, PerSecond: 100, P50: 3, P99: 10},
		{Count: 5, PerSecond: 200, P50: 2, P99: 50, Duplicates: 2},
	})
	if want := (Series{Count: 5, PerSecond: 200, P50: 2, P99: 50, Duplicates: 3}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}
