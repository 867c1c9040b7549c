package throttle_test

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/throttle"
)

func TestBans_Strike(t *testing.T) {
	b := throttle.NewBans(10*time.Second, 35*time.Second)
	t0 := time.Unix(1_000_000, 0)
	strike := func(at time.Time, wantFor time.Duration, wantStrikes int) {
		t.Helper()
		until, strikes, ok := b.Strike("flooder", at)
		if !ok || until.Sub(at) != wantFor || strikes != wantStrikes {
			t.Fatalf("strike at +%v: barred %v for %v (strike %d), want %v (strike %d)", at.Sub(t0), ok, until.Sub(at), strikes, wantFor, wantStrikes)
		}
	}
	strike(t0, 10*time.Second, 1)
	if _, _, ok := b.Strike("flooder", t0.Add(time.Second)); ok {
		t.Fatal("struck again while barred")
	}
	if n := b.Len(t0.Add(9 * time.Second)); n != 1 {
		t.Fatalf("%d barred within the first bar, want the flooder alone", n)
	}
	// Back and flooding at once: each bar twice the last, up to the longest.
	strike(t0.Add(10*time.Second), 20*time.Second, 2)
	strike(t0.Add(30*time.Second), 35*time.Second, 3)
	strike(t0.Add(65*time.Second), 35*time.Second, 4)
	if n := b.Len(t0.Add(70 * time.Second)); n != 1 {
		t.Fatalf("%d barred, want 1", n)
	}
	// Quiet for twice its last bar after it ended: the first bar again.
	end := t0.Add(100 * time.Second)
	if n := b.Len(end); n != 0 {
		t.Fatalf("%d barred after the last bar ended", n)
	}
	strike(end.Add(70*time.Second), 10*time.Second, 1)
}

func TestGate_OnFlood(t *testing.T) {
	g := throttle.New(10, 10, time.Hour, nil)
	var told []int
	g.OnFlood(func(identity string, refused int) {
		if identity != "flooder" {
			t.Errorf("told of %s", identity)
		}
		told = append(told, refused)
	})
	// Its burst, then refusals: the limit of 10 a second over the 2 s window times 10 is 200.
	for range 10 + 200 {
		g.Allow("flooder")
	}
	if len(told) != 0 {
		t.Fatalf("told after 200 refusals: %v", told)
	}
	for range 1000 {
		g.Allow("flooder")
	}
	if len(told) != 1 || told[0] != 201 {
		t.Fatalf("told %v, want once, at the 201st refusal of the window", told)
	}
	for range 20 {
		g.Allow("client") // refused past its burst, far from flooding
	}
	if len(told) != 1 {
		t.Fatalf("told %v after another identity's few refusals", told)
	}
}
