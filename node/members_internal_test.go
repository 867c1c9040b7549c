package node

import "testing"

// TestJetStreamRole: a member's JetStream role as Members shows it. A member gossip says is
// gone (dead, stopped, left) is offline whatever JetStream still says of it: the meta
// leader's peer list keeps a server it has not yet missed current, and a member killed a
// moment ago showed as a follower in green.
func TestJetStreamRole(t *testing.T) {
	peers := map[string]bool{"a": true, "b": true, "c": false}
	for _, tc := range []struct{ name, state, want string }{
		{"a", "alive", "leader"},
		{"b", "alive", "follower"},
		{"b", "suspect", "follower"},
		{"b", "dead", "offline"},
		{"b", "stopped", "offline"},
		{"b", "left", "offline"},
		{"a", "dead", "offline"},
		{"c", "alive", "offline"},
		{"d", "alive", "none"},
		{"d", "left", "none"}, // left, and no longer a peer: gone from JetStream, not offline
		{"d", "dead", "none"},
	} {
		if got := jetStreamRole("a", peers, tc.name, tc.state); got != tc.want {
			t.Errorf("jetStreamRole(%s %s)=%s, want %s", tc.name, tc.state, got, tc.want)
		}
	}
}
