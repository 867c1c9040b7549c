// Package controller is the mesh-controller seat's work on a node (DESIGN §3, §12): it
// answers the registry's tools (register, remove, pin, deploy, provisions, whoami …),
// is the only writer of the mesh's streams and consumers (Topology), and while its node
// holds the seat runs the loops that publish the registry's events, declare every node,
// provision the deployed modules' requirements and follow the build cascade. It also
// sizes the mesh's streams within a node's store (Budget), a module's quota of EVENTS
// among them (package admit enforces it).
//
// A Controller is made by New from a Config that names everything it uses; the node starts
// it when it gains the seat (Start), stops it when it loses it (Stop), and closes it last
// (Close, which waits for everything it started).
package controller
