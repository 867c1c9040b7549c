package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/api"
)

// TestPrintStatus_Replication: the status shows the servers counted, the copies kept and the
// servers tolerated down, lists each stream of a small mesh with its quorum (one without says
// why), and of a large one only the streams that need a look, counting the rest.
func TestPrintStatus_Replication(t *testing.T) {
	r := &api.NodeReplication{Servers: 5, Target: 5, Tolerates: 2, Streams: []api.StreamReplication{
		{Name: "EVENTS", Replicas: 5, Current: 5, Leader: "a", Quorum: true},
		{Name: "KV_mesh-vault", Replicas: 5, Current: 2, Leader: "b", Behind: []string{"c", "d", "e"}, Why: "2 of 5 copies current, a majority is 3"},
		{Name: "SEAT_jobs", Why: "no leader answers: fewer than a majority of its copies are up"},
	}}
	var out strings.Builder
	printStatus(&out, api.NodeStatus{Name: "a", Replication: r})
	for _, want := range []string{
		"replication  5 servers: 5 copies of each stream, any 2 may be down; 3 streams, 1 with quorum (a stream without quorum refuses writes",
		"EVENTS         5         5        a       yes",
		"KV_mesh-vault  5         2        b       no: 2 of 5 copies current, a majority is 3",
		"SEAT_jobs      ?         0        -       no: no leader answers",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}

	// Past twenty streams, only those that need a look.
	r.Streams = r.Streams[:2]
	for i := range 30 {
		r.Streams = append(r.Streams, api.StreamReplication{Name: fmt.Sprintf("SEAT_s%02d", i), Replicas: 5, Current: 5, Leader: "a", Quorum: true})
	}
	out.Reset()
	printStatus(&out, api.NodeStatus{Name: "a", Replication: r})
	if s := out.String(); !strings.Contains(s, "KV_mesh-vault") || strings.Contains(s, "SEAT_s00") || strings.Contains(s, "EVENTS ") ||
		!strings.Contains(s, "and 31 more streams at 5 copies, all current (--json lists every stream)") {
		t.Errorf("a mesh of 32 streams, one without quorum:\n%s", s)
	}
}

// TestPrintStatus_Versions: a mesh whose servers all run one meshnode says so; a mesh in a
// rolling upgrade lists each version with its servers, a member that does not tell its
// version (older than version reporting) and one that is down among them.
func TestPrintStatus_Versions(t *testing.T) {
	var out strings.Builder
	printStatus(&out, api.NodeStatus{Name: "a", Members: []api.MemberVersion{
		{Name: "a", State: "alive", Version: "v1.4.0"}, {Name: "b", State: "alive", Version: "v1.4.0"},
	}})
	if want := "versions     every server (2) runs v1.4.0\n"; !strings.Contains(out.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, out.String())
	}

	out.Reset()
	printStatus(&out, api.NodeStatus{Name: "a", Members: []api.MemberVersion{
		{Name: "a", State: "alive", Version: "v1.5.0"}, {Name: "b", State: "stopped", Version: "v1.4.0"},
		{Name: "c", State: "alive", Version: "v1.4.0"}, {Name: "d", State: "alive"},
	}})
	if want := "versions     mixed (finish the upgrade one server at a time): unknown (a meshnode older than version reporting) on d; v1.4.0 on b (stopped), c; v1.5.0 on a\n"; !strings.Contains(out.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, out.String())
	}

	out.Reset()
	printStatus(&out, api.NodeStatus{Name: "a"})
	if strings.Contains(out.String(), "versions") {
		t.Errorf("a single node's status shows versions:\n%s", out.String())
	}
}

// TestPrintStatus_Formats: a mesh's status shows the versions of the shared formats its
// servers agree on, or why they cannot; a single node's shows none.
func TestPrintStatus_Formats(t *testing.T) {
	var out strings.Builder
	printStatus(&out, api.NodeStatus{Name: "a", Formats: map[string]int{"wire": 1, "declaration": 2}})
	if want := "formats      declaration 2, wire 1 (written by every server, read by every one)\n"; !strings.Contains(out.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	printStatus(&out, api.NodeStatus{Name: "a", Formats: map[string]int{"wire": 1}, FormatsError: "no version in common of declaration"})
	if want := "formats      no version in common of declaration\n"; !strings.Contains(out.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	printStatus(&out, api.NodeStatus{Name: "a"})
	if strings.Contains(out.String(), "formats") {
		t.Errorf("a single node's status shows formats:\n%s", out.String())
	}
}

// TestPrintMembers_Version: members shows each server's version, "?" for one that does not
// tell it.
func TestPrintMembers_Version(t *testing.T) {
	var out strings.Builder
	printMembers(&out, []api.NodeMember{
		{Name: "a", Address: "nats://h:4222", State: "alive", JetStream: "leader", Version: "v1.5.0"},
		{Name: "b", Address: "nats://h:4223", State: "alive", JetStream: "follower"},
	})
	for _, want := range []string{"VERSION", "leader     v1.5.0", "follower   ?"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("members lacks %q:\n%s", want, out.String())
		}
	}
}
