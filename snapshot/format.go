package snapshot

import (
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/streammove"
)

// The file's layout, in the order of its entries.
const (
	// Kind is what every snapshot's manifest says it is.
	Kind = "meshnode-snapshot"
	// FormatVersion is the newest format this binary writes and reads. A change that an
	// older reader would misread raises it; Open refuses a newer one, naming it.
	FormatVersion = 1

	// ManifestEntry is the first entry: the Manifest as JSON.
	ManifestEntry = "MANIFEST.json"
	// streamsDir holds one entry per stream, <streamsDir><name>.snap: the JetStream snapshot
	// as streammove.SnapshotStream writes it and streammove.Restore reads it.
	streamsDir = "streams/"
	// SumsEntry is the last entry: "<sha256 hex>  <entry>" per line for every entry before
	// it, then a line for SUMS itself, the SHA-256 of the lines before it. A file cut short
	// after an intact manifest lacks it; a changed byte in any entry is told by its line.
	SumsEntry = "SHA256SUMS"
)

// Manifest is what a snapshot holds, in its first entry.
type Manifest struct {
	Kind          string `json:"kind"`           // Kind
	FormatVersion int    `json:"format_version"` // the format it was written in
	// MeshnodeVersion is the version of the meshnode binary that wrote it.
	MeshnodeVersion string    `json:"meshnode_version"`
	Created         time.Time `json:"created"` // UTC, when the save began
	MeshID          string    `json:"mesh_id"`
	// Operator is the operator's public nkey, "" when the saver did not read it.
	Operator string `json:"operator,omitempty"`
	// Server is the node whose server the snapshot was taken through.
	Server string `json:"server"`
	// Foundation is the mesh's route secret, gossip key and vault seed sealed under the
	// barrier key (the operator's recovery key): nil when the saver could not ask the vault
	// for it, and then a restore makes a new route secret (a new CA) and cannot open the
	// vault's records.
	Foundation *api.SealedFoundation `json:"foundation,omitempty"`
	// AuditHeads are each node's audit-log head at the save, by node: a restored node's
	// log names them in the record it begins with.
	AuditHeads map[string]api.AuditHead `json:"audit_heads,omitempty"`
	// Streams are in the order a restore takes them (see order).
	Streams []Stream `json:"streams"`
}

// Stream is one stream of a snapshot: what streammove.Restore needs of it (its
// configuration, its state at the snapshot and its durable consumers), and its entry.
type Stream struct {
	streammove.Stream
	Entry  string `json:"entry"`  // the entry that holds its snapshot
	Size   int64  `json:"size"`   // the entry's size, bytes
	SHA256 string `json:"sha256"` // the entry's SHA-256, hex
}

// Name is the stream's name.
func (s Stream) Name() string { return s.Config.Name }

// entryName is stream name's entry.
func entryName(name string) string { return streamsDir + name + ".snap" }
