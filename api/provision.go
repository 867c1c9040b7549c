package api

import "time"

// Provision is one consumer's provision of one interface: the record the controller keeps in
// the mesh-provisions bucket and answers to `meshnode provisions` (package provision calls it
// Record and owns its states and key).
type Provision struct {
	Consumer  string `json:"consumer"`
	Interface string `json:"interface"`
	// Provider is the seat that provides it ("mesh" for the mesh's own); empty while none is
	// resolved.
	Provider string    `json:"provider"`
	State    string    `json:"state"`
	Since    time.Time `json:"since"`
	Reason   string    `json:"reason"` // why it waits or failed; empty when ready
	// Options are what the resource was asked for (the manifest's): another set creates it
	// again.
	Options map[string]string `json:"options,omitempty"`
	// Generation rises with each create: a consumer restarts with a new credential.
	Generation uint64 `json:"generation"`
}
