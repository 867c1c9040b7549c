package api

import (
	"time"

	"github.com/meshnode/meshnode/manifest"
)

// The seats' wire types: what a module's instance asks its node about its seats, and what
// the controller answers about every seat (`meshnode seat ls`).

// SeatRequest is what a module's instance asks its node about one of its seats, on
// mesh.node.<node>.tool.seat.<module>.
type SeatRequest struct {
	// Action is "candidate" (hold the seat when it is free; answers the current state) or
	// "release" (stop holding it now, for a graceful handoff).
	Action string `json:"action"`
	Seat   string `json:"seat"`
	// Instance is the asking connection's name: the holder is one instance.
	Instance string `json:"instance"`
}

// SeatReply answers SeatRequest.
type SeatReply struct {
	Seat string `json:"seat"`
	// Holder is true when the instance holds the seat's lease: its connection then has the
	// holder's permissions, and it may pull Consumer on Stream.
	Holder   bool   `json:"holder"`
	Epoch    uint64 `json:"epoch,omitempty"`
	Stream   string `json:"stream,omitempty"`
	Consumer string `json:"consumer,omitempty"`
	Error    string `json:"error,omitempty"`
}

// SeatListSubject lists every seat, its holder and backlog (`meshnode seat ls`).
var SeatListSubject = manifest.SeatToolSubject(manifest.ControllerSeat, "seats")

// SeatStatus is one seat as SeatListSubject reports it.
type SeatStatus struct {
	Seat     string         `json:"seat"`
	Scope    manifest.Scope `json:"scope"`
	Module   string         `json:"module,omitempty"` // the declaring module; "" for the mesh's own
	Node     string         `json:"node,omitempty"`   // node scope: one row per node
	Holder   string         `json:"holder,omitempty"` // the holding instance; "" when unheld
	HolderAt string         `json:"holder_node,omitempty"`
	Epoch    uint64         `json:"epoch,omitempty"`
	Since    *time.Time     `json:"since,omitempty"`
	Backlog  uint64         `json:"backlog"`
	Users    []string       `json:"users,omitempty"` // modules that use the seat
	// Versions are the seat's protocol versions, v1 first, with the modules bound to each;
	// a version nobody is bound to is retirable (never removed automatically).
	Versions []SeatVersionStatus `json:"versions,omitempty"`
}

// SeatVersionStatus is one protocol version of a seat in `meshnode seat ls`.
type SeatVersionStatus struct {
	Version string `json:"version"`
	// Bound are the modules pinned to this version: its users and the consumers of its
	// events by the seat's name.
	Bound     []string `json:"bound"`
	Retirable bool     `json:"retirable"`
}

// SeatListReply answers a SeatListSubject request.
type SeatListReply struct {
	Seats []SeatStatus `json:"seats"`
	Error string       `json:"error,omitempty"`
}
