package api

import "time"

// The node's cluster tools, for the operator: mesh.node.<node>.tool.leave and
// mesh.node.<node>.tool.remove. Only admin identities may publish on a node's tools.
const (
	NodeToolLeave  = "leave"
	NodeToolRemove = "remove"
)

// ClusterRequest is the body of a cluster tool request.
type ClusterRequest struct {
	Node string `json:"node,omitempty"` // remove: the server to remove
}

// ClusterReply is a cluster tool's answer.
type ClusterReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// NodeToolGrow is the single node's tool that starts growing it: mesh.node.<node>.tool.grow.
const NodeToolGrow = "grow"

// GrowRequest is the body of a grow request.
type GrowRequest struct {
	Expect int `json:"expect"` // the servers of the mesh it grows into, itself included: 3 or more
}

// NodeToolAcceptLoss is the node tool with which the operator accepts a kept bucket's loss
// (mesh.node.<node>.tool.accept-loss, body AcceptLossRequest): the bucket gets its marker
// again and the alarm clears on every node at its next check.
const NodeToolAcceptLoss = "accept-loss"

// AcceptLossRequest names the bucket whose loss the operator accepts.
type AcceptLossRequest struct {
	Bucket string `json:"bucket"`
}

// NodeToolCertRotate is the node's tool that renews its certificate:
// mesh.node.<node>.tool.cert-rotate.
const NodeToolCertRotate = "cert-rotate"

// The node's tools that report on it, for the operator (`meshnode status`, `members` and
// `ui` against a node reached only by its bus): mesh.node.<node>.tool.status answers a
// NodeStatus, mesh.node.<node>.tool.members a NodeMembersReply. The request's body is
// ignored. Only admin identities may publish on a node's tools.
const (
	NodeToolStatus  = "status"
	NodeToolMembers = "members"
)

// NodeToolUI is the node's tool that gives a dashboard login challenge over the bus
// (mesh.node.<node>.tool.ui, any body): `meshnode ui` signs it with the operator's seed, as it
// signs GET /ui/challenge's, for a node whose HTTP address is reached only through a tunnel.
const NodeToolUI = "ui"

// UIChallenge answers NodeToolUI: the node, its mesh, the challenge's nonce (one use, within
// a minute) and the HTTP address the node's dashboard listens on.
type UIChallenge struct {
	Node    string `json:"node"`
	MeshID  string `json:"mesh_id"`
	Nonce   string `json:"nonce"`
	HTTPURL string `json:"http_url"`
}

// NodeMembersReply answers NodeToolMembers.
type NodeMembersReply struct {
	Members []NodeMember `json:"members"`
}

// NodeStatus is what /v1/status, the status tool and `meshnode status --json` report.
type NodeStatus struct {
	Name        string `json:"name"`
	MeshID      string `json:"mesh_id"`
	Version     string `json:"version"`
	ClientURL   string `json:"client_url"`
	HTTPURL     string `json:"http_url"`
	ClusterAddr string `json:"cluster_addr"`
	GossipAddr  string `json:"gossip_addr"`
	Ready       bool   `json:"ready"`
	Reason      string `json:"reason,omitempty"`  // why not ready
	Growing     string `json:"growing,omitempty"` // a single node growing into a mesh: how far
	// AppliedRevision is the revision of the declaration this node's host applied last (0:
	// none yet): what it runs, kept across restarts.
	AppliedRevision uint64              `json:"applied_revision,omitempty"`
	Started         time.Time           `json:"started"`
	UptimeSeconds   float64             `json:"uptime_seconds"`
	Connections     int                 `json:"connections"`
	JetStream       NodeJetStreamStatus `json:"jetstream"`
	Audit           NodeAuditStatus     `json:"audit"`
	// Replication is the mesh's streams' replication; nil on a node that is not serving yet.
	Replication *NodeReplication `json:"replication,omitempty"`
	// Members are the mesh's servers' meshnode versions, by name, as this node's gossip
	// knows them: a mesh in a rolling upgrade shows two. Nil on a single node.
	Members []MemberVersion `json:"members,omitempty"`
	// Formats are the versions of the formats servers write and read of one another that the
	// mesh's servers agree on (package formats, Agree); FormatsError why they do not. Nil on
	// a single node.
	Formats      map[string]int `json:"formats,omitempty"`
	FormatsError string         `json:"formats_error,omitempty"`
}

// MemberVersion is one server's meshnode version in NodeStatus.
type MemberVersion struct {
	Name  string `json:"name"`
	State string `json:"state"` // as NodeMember's
	// Version is "" for a member running a meshnode older than this field: it does not
	// tell its version.
	Version string `json:"version,omitempty"`
}

// NodeReplication is the replication part of NodeStatus: how many copies the mesh keeps of
// each stream, and whether each stream has a quorum now.
type NodeReplication struct {
	Servers   int                 `json:"servers"`   // the mesh's servers (registered identities)
	Target    int                 `json:"target"`    // copies kept of each stream with that many servers
	Tolerates int                 `json:"tolerates"` // servers that may be down while every stream keeps a quorum
	Streams   []StreamReplication `json:"streams"`
	Error     string              `json:"error,omitempty"` // the streams could not be listed: why
}

// NodeAuditStatus is the audit logger's part of NodeStatus.
type NodeAuditStatus struct {
	Records uint64 `json:"records"` // records kept
	Audited uint64 `json:"audited"` // every EVENTS sequence up to this one is in the log (the consumer's ack floor)
	Lag     uint64 `json:"lag"`     // EVENTS' last sequence − Audited
	// Missed counts events that left EVENTS before the log read them (its per-subject cap or
	// age limit evicted them while the log was behind, or they were deleted): gaps.
	Missed uint64 `json:"missed"`
}

// NodeJetStreamStatus is the JetStream part of NodeStatus.
type NodeJetStreamStatus struct {
	Enabled bool   `json:"enabled"`
	Mode    string `json:"mode"` // "standalone" or "clustered", as the server reports it
	// MetaLeader and Peers describe a clustered server's meta group: its leader ("" while
	// there is none) and every peer, with whether it is current.
	MetaLeader string          `json:"meta_leader,omitempty"`
	Peers      map[string]bool `json:"peers,omitempty"`
	Streams    int             `json:"streams"`
	Consumers  int             `json:"consumers"`
	Messages   uint64          `json:"messages"`
	Bytes      uint64          `json:"bytes"`
}

// NodeMember is one server of the mesh, as `meshnode members` shows it.
type NodeMember struct {
	Name string `json:"name"`
	// Address is always the member's client URL (nats://host:port or tls://host:port): where
	// a module or `meshnode --server` connects to it. "" for a member whose gossip carried
	// none.
	Address    string   `json:"address"`
	GossipAddr string   `json:"gossip_addr,omitempty"` // host:port of its membership gossip; "" for a single node
	State      string   `json:"state"`                 // alive, suspect, dead, left
	JetStream  string   `json:"jetstream"`             // leader, follower or offline (a peer of the meta group that does not answer); none (not a peer); standalone
	Seats      []string `json:"seats"`                 // the seats held by this node or its modules
	// Version is the member's meshnode version, as its gossip tells it; "" for a member
	// running a meshnode older than this field.
	Version string `json:"version,omitempty"`
}

// StreamReplication is one stream's replication, as `meshnode status` shows it.
type StreamReplication struct {
	Name     string `json:"name"`
	Replicas int    `json:"replicas"`         // copies its configuration asks for; 0: its leader did not answer
	Current  int    `json:"current"`          // copies up to date, the leader's included
	Leader   string `json:"leader,omitempty"` // the server whose copy leads; "" while none does
	// Quorum: a majority of its copies are current under a leader, so it takes writes.
	Quorum bool     `json:"quorum"`
	Behind []string `json:"behind,omitempty"` // servers with a copy that is not current (offline, catching up)
	Why    string   `json:"why,omitempty"`    // why it has no quorum
}
