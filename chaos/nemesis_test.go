package chaos

import (
	"slices"
	"testing"
)

// draw is the first n kinds a nemesis of seed schedules on a mesh of members servers.
func draw(seed int64, members, n int) []string {
	nm := NewNemesis(&Cluster{o: Options{Servers: members}}, seed)
	owed := nm.firstRound()
	var out []string
	for range n {
		out = append(out, nm.next(&owed))
	}
	return out
}

// TestNemesis_ScheduleIsEveryKindFirstAndTheSeedsOwn: the first faults of a schedule are
// every kind once, so a short run injects them all; the same seed draws the same schedule,
// another seed another.
func TestNemesis_ScheduleIsEveryKindFirstAndTheSeedsOwn(t *testing.T) {
	first := draw(7, 5, len(Kinds))
	got := slices.Sorted(slices.Values(first))
	want := slices.Sorted(slices.Values(Kinds))
	if !slices.Equal(got, want) {
		t.Fatalf("the first %d faults are %v, want every kind once", len(Kinds), first)
	}
	if again := draw(7, 5, 40); !slices.Equal(again, draw(7, 5, 40)) {
		t.Fatalf("seed 7 drew two schedules: %v", again)
	}
	if slices.Equal(draw(7, 5, 40), draw(8, 5, 40)) {
		t.Fatal("seeds 7 and 8 drew the same schedule")
	}
	// Past the first round, kinds are drawn from all of them: a long run repeats them.
	counts := map[string]int{}
	for _, k := range draw(7, 5, 200) {
		counts[k]++
	}
	for _, k := range Kinds {
		if counts[k] < 2 {
			t.Errorf("kind %s drawn %d times in 200 faults", k, counts[k])
		}
	}
}

// TestNemesis_DoubleFaultsNeedFive: a mesh of three survives one fault, not two: the
// nemesis draws no double fault for it, and owes them until the mesh has grown to five.
func TestNemesis_DoubleFaultsNeedFive(t *testing.T) {
	c := &Cluster{o: Options{Servers: 3}}
	nm := NewNemesis(c, 3)
	owed := nm.firstRound()
	for range 100 {
		if k := nm.next(&owed); k == KindKillTwo || k == KindKillDuringPartition {
			t.Fatalf("a mesh of three was given %s", k)
		}
	}
	if !slices.Contains(owed, KindKillTwo) || !slices.Contains(owed, KindKillDuringPartition) {
		t.Fatalf("the double faults are no longer owed: %v", owed)
	}
	// Cover waits only for kinds the mesh can take: a mesh of three does not run forever.
	if nm.owes(owed) {
		t.Fatalf("a mesh of three is said to owe %v", owed)
	}
	c.grown = 2
	if !nm.owes(owed) {
		t.Fatalf("a mesh of five is said to owe nothing of %v", owed)
	}
	var next []string
	for range 2 {
		next = append(next, nm.next(&owed))
	}
	slices.Sort(next)
	if !slices.Equal(next, []string{KindKillDuringPartition, KindKillTwo}) {
		t.Fatalf("grown to five, the next faults are %v, want the two owed double faults", next)
	}
}

// TestNemesis_PicksDistinctMembers: a double fault hits two servers, never one twice, and
// only members (not spares).
func TestNemesis_PicksDistinctMembers(t *testing.T) {
	nm := NewNemesis(&Cluster{o: Options{Servers: 5, Spare: 2}}, 11)
	for range 100 {
		p := nm.pick(2)
		if p[0] == p[1] || p[0] > 4 || p[1] > 4 {
			t.Fatalf("picked %v of members 0–4", p)
		}
	}
	if got := nm.Counts(); len(got) != len(Kinds) || got[KindKill] != 0 {
		t.Fatalf("counts before any fault: %v, want every kind at 0", got)
	}
}

// TestNemesis_DriftTargetsAreItsOwn: the drift kinds delete what DriftTargets named, held as
// a copy: the caller's slices may change after.
func TestNemesis_DriftTargetsAreItsOwn(t *testing.T) {
	nm := NewNemesis(&Cluster{o: Options{Servers: 5}}, 1)
	if got := nm.targets(KindDriftConsumer); got != nil {
		t.Fatalf("targets before DriftTargets: %v, want none (found on the mesh)", got)
	}
	consumers, streams := []string{"ledger"}, []string{"SEAT_mail"}
	nm.DriftTargets(consumers, streams)
	consumers[0], streams[0] = "changed", "changed"
	if got := nm.targets(KindDriftConsumer); !slices.Equal(got, []string{"ledger"}) {
		t.Fatalf("consumer targets %v, want [ledger]", got)
	}
	if got := nm.targets(KindDriftStream); !slices.Equal(got, []string{"SEAT_mail"}) {
		t.Fatalf("stream targets %v, want [SEAT_mail]", got)
	}
}
