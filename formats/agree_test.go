package formats_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/formats"
	"github.com/meshnode/meshnode/membership"
)

// TestAgree: the agreed version of each shared format is the newest every member writes and
// reads; a member advertising nothing counts as version 1; members without a version in
// common are named, with what to do.
func TestAgree(t *testing.T) {
	v1 := formats.Advertised{formats.Declaration: {1, 1}, formats.Wire: {1, 1}}
	v2 := formats.Advertised{formats.Declaration: {1, 2}, formats.Wire: {1, 1}}
	only2 := formats.Advertised{formats.Declaration: {2, 2}, formats.Wire: {1, 1}}
	for _, tc := range []struct {
		name    string
		members map[string]formats.Advertised
		want    int // the declaration's agreed version
		wantErr []string
	}{
		{"every server on the newer version", map[string]formats.Advertised{"a": v2, "b": v2, "c": v2}, 2, nil},
		{"one server not upgraded yet", map[string]formats.Advertised{"a": v2, "b": v1, "c": v2}, 1, nil},
		{"one server older than the advertisement", map[string]formats.Advertised{"a": v2, "b": nil, "c": v2}, 1, nil},
		{"a server that reads only the newer version beside an old one", map[string]formats.Advertised{"a": only2, "b": v1, "c": v2}, 0,
			[]string{"declaration: b writes at most version 1, and a reads nothing older than 2", "upgrade the older server", "node remove"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agreed, err := formats.Agree(tc.members)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("agreed %v, want a refusal", agreed)
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("refusal %q does not say %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if agreed[formats.Declaration] != tc.want || agreed[formats.Wire] != 1 {
				t.Errorf("agreed %v, want declaration %d and wire 1", agreed, tc.want)
			}
		})
	}
}

// TestAdvertise: a server advertises the shared formats of its table, and this binary's
// advertisement agrees with itself on what it writes.
func TestAdvertise(t *testing.T) {
	all := formats.All()
	adv := formats.Advertise(all)
	if len(adv) != len(formats.Shared) {
		t.Errorf("advertised %v, want exactly the shared formats %v", adv, formats.Shared)
	}
	agreed, err := formats.Agree(map[string]formats.Advertised{"a": adv, "b": adv})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range formats.Shared {
		if agreed[name] != all[name].Writes {
			t.Errorf("%s: two servers of this binary agree on %d, want what it writes, %d", name, agreed[name], all[name].Writes)
		}
	}
}

// TestWatcher_SwitchesOnceEveryMemberIsUpgraded is a rolling upgrade as gossip shows it: the
// newer servers keep writing the older version while any member (a stopped one too) is on it,
// switch once the last one is upgraded — reported once — and a member that left for good
// stops counting.
func TestWatcher_SwitchesOnceEveryMemberIsUpgraded(t *testing.T) {
	v1 := formats.Advertised{formats.Declaration: {1, 1}, formats.Wire: {1, 1}}
	v2 := formats.Advertised{formats.Declaration: {1, 2}, formats.Wire: {1, 1}}
	member := func(name, state string, f formats.Advertised) membership.Member {
		return membership.Member{Meta: membership.Meta{Name: name, Formats: f}, State: state}
	}
	members := []membership.Member{member("a", "alive", v1), member("b", "alive", v1), member("c", "alive", v1)}
	var switches []formats.Switch
	w := &formats.Watcher{
		Members:  func() []membership.Member { return members },
		OnSwitch: func(s formats.Switch) { switches = append(switches, s) },
	}
	declaration := func() int {
		t.Helper()
		agreed, err := w.Agreed()
		if err != nil {
			t.Fatal(err)
		}
		return agreed[formats.Declaration]
	}
	w.Update()
	members[0] = member("a", "alive", v2)
	w.Update()
	members[1] = member("b", "stopped", v1) // being replaced: still counts
	w.Update()
	if got := declaration(); got != 1 || len(switches) != 0 {
		t.Fatalf("two servers on version 1 (one stopped): agreed declaration %d, switches %v; want 1 and none", got, switches)
	}
	members[1] = member("b", "alive", v2)
	w.Update()
	if got := declaration(); got != 1 {
		t.Fatalf("c still on version 1: agreed declaration %d", got)
	}
	members[2] = member("c", "left", v1) // left for good: no longer counts
	w.Update()
	w.Update()
	want := []formats.Switch{{Format: formats.Declaration, From: 1, To: 2}}
	if got := declaration(); got != 2 || len(switches) != 1 || switches[0] != want[0] {
		t.Fatalf("every remaining member on version 2: agreed declaration %d, switches %v; want 2 and %v once", got, switches, want)
	}
}

// TestWatcher_ReportsNoCommonVersion: a member the others cannot agree with is reported once
// while it stays so, and the last agreement is kept meanwhile.
func TestWatcher_ReportsNoCommonVersion(t *testing.T) {
	members := []membership.Member{
		{Meta: membership.Meta{Name: "a", Formats: formats.Advertised{formats.Declaration: {1, 1}}}, State: "alive"},
	}
	var errs []error
	w := &formats.Watcher{Every: time.Millisecond, Members: func() []membership.Member { return members }, OnError: func(err error) { errs = append(errs, err) }}
	w.Update()
	members = append(members, membership.Member{Meta: membership.Meta{Name: "z", Formats: formats.Advertised{formats.Declaration: {3, 3}}}, State: "alive"})
	w.Update()
	w.Update()
	agreed, err := w.Agreed()
	if err == nil || len(errs) != 1 || !strings.Contains(err.Error(), "z reads nothing older than 3") {
		t.Fatalf("after z joined: err %v, reported %v; want the refusal naming z, reported once", err, errs)
	}
	if agreed[formats.Declaration] != 1 {
		t.Errorf("the agreement kept meanwhile: %v, want declaration 1", agreed)
	}
}

// TestWatcher_Run agrees at once and then every interval until its context ends.
func TestWatcher_Run(t *testing.T) {
	calls := make(chan struct{}, 10)
	w := &formats.Watcher{Every: time.Millisecond, Members: func() []membership.Member {
		select {
		case calls <- struct{}{}:
		default:
		}
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	<-calls
	<-calls
	cancel()
	<-done
}
