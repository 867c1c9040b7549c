package formats

import (
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/snapshot"
)

// Version is one format's versions in this binary.
type Version struct {
	// Writes is the version this binary writes.
	Writes int `json:"writes"`
	// ReadsFrom is the oldest version this binary reads; it reads every version from it up
	// to Writes.
	ReadsFrom int `json:"reads_from"`
}

// The formats' names, as `meshnode version` prints them.
const (
	// Snapshot is the file `meshnode snapshot save` writes: its manifest's format_version.
	Snapshot = "snapshot"
	// Store is the node's bbolt store (meshnode.db in the data dir): its buckets and keys.
	// Version 1 is the layout as it was when this list was made; the store has no marker.
	Store = "store"
	// Audit is the audit log's record and its hash chain: the record's leading byte, 2 for
	// the compact encoding; 1 is a record in JSON, the first encoding.
	Audit = "audit"
	// Declaration is a node's declaration on STATE (deploy.Declaration, signed by the
	// controller). Version 1 is the declaration as it was when this list was made; it has no
	// marker.
	Declaration = "declaration"
	// Wire is the mesh's wire protocol: the requests and replies of package api, the event
	// envelope's headers, and the membership gossip's node meta (internal/wiregolden holds
	// their shapes). Version 1 is the protocol as it was when this list was made; it has no
	// marker, and a change to it so far only added fields an older reader ignores.
	Wire = "wire"
)

// All lists every format with its versions in this binary, by name.
func All() map[string]Version {
	return map[string]Version{
		Snapshot:    {Writes: snapshot.FormatVersion, ReadsFrom: snapshot.FormatVersion},
		Store:       {Writes: 1, ReadsFrom: 1},
		Audit:       {Writes: audit.RecordFormat, ReadsFrom: audit.OldestRecordFormat},
		Declaration: {Writes: 1, ReadsFrom: 1},
		Wire:        {Writes: 1, ReadsFrom: 1},
	}
}
