package throttle_test

import (
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/throttle"
)

func TestGate_AllowPerIdentity(t *testing.T) {
	g := throttle.New(1, 3, time.Hour, nil)
	for i := range 3 {
		if ok, _ := g.Allow("a"); !ok {
			t.Fatalf("request %d of a burst of 3 refused", i+1)
		}
	}
	if ok, tell := g.Allow("a"); ok || !tell {
		t.Fatalf("a 4th request within the burst of 3: allowed %v, told %v; want refused and told", ok, tell)
	}
	if ok, tell := g.Allow("a"); ok || tell {
		t.Fatalf("a 5th request at once: allowed %v, told %v; want refused silently", ok, tell)
	}
	if ok, _ := g.Allow("b"); !ok {
		t.Fatal("b refused because a spent its budget")
	}
}

func TestGate_ReportsOncePerIdentityWithACount(t *testing.T) {
	var mu sync.Mutex
	var got []throttle.Refusal
	g := throttle.New(1, 1, time.Hour, func(r throttle.Refusal) {
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
	})
	for range 1000 {
		g.Allow("flooder")
	}
	g.Refused("flooder", "undeclared secret", "x")
	g.Refused("flooder", "undeclared secret", "the last one")
	g.Flush()
	if len(got) != 2 {
		t.Fatalf("reports = %+v, want one per identity and reason", got)
	}
	for _, r := range got {
		switch r.Reason {
		case "rate":
			if r.Count != 999 {
				t.Errorf("rate refusals counted %d, want 999", r.Count)
			}
		case "undeclared secret":
			if r.Count != 2 || r.Detail != "the last one" {
				t.Errorf("undeclared refusals counted %d (%q), want 2 with the last detail", r.Count, r.Detail)
			}
		default:
			t.Errorf("unexpected report %+v", r)
		}
	}
	got = nil
	g.Flush()
	if len(got) != 0 {
		t.Errorf("a second flush reported again: %+v", got)
	}
}
