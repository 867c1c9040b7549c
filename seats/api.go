package seats

import (
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
)

// The seats' wire types: what a module's instance asks its node about its seats, and what
// the controller answers about every seat (`meshnode seat ls`).

// Info names a seat and its protocol (api.SeatInfo): the registry, below seats' users,
// answers it without importing seats.
type Info = api.SeatInfo

// Request is what a module's instance asks its node about one of its seats, on
// mesh.node.<node>.tool.seat.<module>.
type Request struct {
	// Action is "candidate" (hold the seat when it is free; answers the current state) or
	// "release" (stop holding it now, for a graceful handoff).
	Action string `json:"action"`
	Seat   string `json:"seat"`
	// Instance is the asking connection's name: the holder is one instance.
	Instance string `json:"instance"`
}

// Reply answers Request.
type Reply struct {
	Seat string `json:"seat"`
	// Holder is true when the instance holds the seat's lease: its connection then has the
	// holder's permissions, and it may pull Consumer on Stream.
	Holder   bool   `json:"holder"`
	Epoch    uint64 `json:"epoch,omitempty"`
	Stream   string `json:"stream,omitempty"`
	Consumer string `json:"consumer,omitempty"`
	Error    string `json:"error,omitempty"`
}

// ListSubject lists every seat, its holder and backlog (`meshnode seat ls`).
var ListSubject = manifest.SeatToolSubject(manifest.ControllerSeat, "seats")

// Status is one seat as ListSubject reports it.
type Status struct {
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
	Versions []VersionStatus `json:"versions,omitempty"`
}

// VersionStatus is one protocol version of a seat in `meshnode seat ls`.
type VersionStatus struct {
	Version string `json:"version"`
	// Bound are the modules pinned to this version: its users and the consumers of its
	// events by the seat's name.
	Bound     []string `json:"bound"`
	Retirable bool     `json:"retirable"`
}

// ListReply answers a ListSubject request.
type ListReply struct {
	Seats []Status `json:"seats"`
	Error string   `json:"error,omitempty"`
}
