// Package membership adapts hashicorp/memberlist to meshnode: nodes find each other by
// gossip encrypted with the mesh's gossip key, tell each other their name, mesh id and the
// addresses of their bus, and refuse — with a message that says so, never an opaque EOF — a
// node of another mesh. Cluster formation (waiting for the expected members, then starting
// the bus with every route) builds on it.
package membership
