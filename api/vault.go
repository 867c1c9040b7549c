package api

import (
	"time"

	"github.com/meshnode/meshnode/manifest"
)

// The vault's wire: core request/reply on mesh.seat.mesh-vault.tool.<verb>.<caller>;
// vault.Call makes such a call and opens its sealed reply.

// Callers that are not modules. A module calls as VaultModuleCaller(its name), a separate
// namespace, so no module name can pass for an administrator.
const (
	VaultCallerOperator = "operator"
	VaultCallerNode     = "node"
)

// VaultModuleCaller is how module calls the vault: mod.<module>.
func VaultModuleCaller(module string) string { return "mod." + module }

// The vault's verbs: core request/reply on mesh.seat.mesh-vault.tool.<verb>.<caller>. The
// caller in the subject is the proof of who asks: a module may publish only on
// fetch.mod.<its name>, a join token's key only on enrol.<its id>; the operator and the nodes
// (operator, node) administer.
const (
	VaultVerbMint     = "mint"
	VaultVerbFetch    = "fetch"
	VaultVerbRotate   = "rotate"
	VaultVerbList     = "ls"
	VaultVerbToken    = "token"
	VaultVerbEnrol    = "enrol"
	VaultVerbIdentity = "identity"
	// VaultVerbServer hands another server of the mesh the vault's own credentials (the
	// barrier key and the vault's bus identity), sealed to that node's xkey, so it can serve
	// the vault seat too. Only the nodes (and the operator) may ask.
	VaultVerbServer = "server"
	// VaultVerbModule hands a server the credentials of a module its declaration says it
	// runs — the module's seed and the secrets the declaration names — sealed to that
	// server's recorded xkey. Only the nodes ask.
	VaultVerbModule = "module"
	// VaultVerbIntake answers the vault's intake xkey (public): a provider seals the
	// credential it creates to it, the operator a value it gives a secret (mint and rotate
	// carry it sealed). The operator and the nodes ask. VaultVerbProvision hands the vault
	// such a sealed credential to keep under its consumer; VaultVerbUnprovision drops it.
	// Only the nodes (the controller's holder) ask.
	VaultVerbIntake      = "intake"
	VaultVerbProvision   = "provision"
	VaultVerbUnprovision = "unprovision"
	// VaultVerbRecoveryKey hands the operator the recovery key (RecoveryKey: the barrier
	// key, printed with a checksum), which a snapshot is restored with; VaultVerbFoundation
	// hands the operator the mesh's foundation sealed under it (SealedFoundation), which
	// `snapshot save` writes into the file. Only the operator asks.
	VaultVerbRecoveryKey = "recovery-key"
	VaultVerbFoundation  = "foundation"
)

// VaultToolSubject is where caller asks the vault for verb.
func VaultToolSubject(verb, caller string) string {
	return manifest.SeatToolSubject(manifest.VaultSeat, verb) + "." + caller
}

// VaultEventSubject is where the vault records an action: mesh.seat.mesh-vault.event.<action>.
func VaultEventSubject(action string) string {
	return manifest.SeatEventSubject(manifest.VaultSeat, action)
}

// VaultRequest is any vault request. XKey is the caller's xkey public key: every reply that
// carries a secret is sealed to it.
type VaultRequest struct {
	XKey    string `json:"xkey"`
	Owner   string `json:"owner,omitempty"` // a module, or "operator"; a module's fetch is its own
	Name    string `json:"name,omitempty"`
	Version int    `json:"version,omitempty"` // fetch: 0 = current
	Grace   string `json:"grace,omitempty"`   // rotate: how long the previous version stays readable
	TTL     string `json:"ttl,omitempty"`     // token: validity
	Uses    int    `json:"uses,omitempty"`    // token: how many joins
	Node    string `json:"node,omitempty"`    // enrol: the joining node's name
	MeshID  string `json:"mesh_id,omitempty"` // enrol: the mesh the token names
	// SiteKey, in an enrol, makes the joining node a site of the mesh (issue 42), whose link
	// authenticates with this nkey user public key: it receives no secret of the mesh's.
	SiteKey string `json:"site_key,omitempty"`
	// provision, mint, rotate: a credential or value sealed to the vault's intake xkey, and
	// who sealed it.
	Sealed []byte `json:"sealed,omitempty"`
	Sender string `json:"sender,omitempty"`
}

// VaultReply is any vault reply: Sealed (to the request's XKey, opened with Sender) when it
// carries a secret, Meta otherwise, Error when refused.
type VaultReply struct {
	// PublicKey is a minted identity's public key (identity): public, so unsealed.
	PublicKey string      `json:"public_key,omitempty"`
	Sealed    []byte      `json:"sealed,omitempty"`
	Sender    string      `json:"sender,omitempty"`
	Meta      []VaultMeta `json:"meta,omitempty"`
	Error     string      `json:"error,omitempty"`
}

// VaultMeta describes a secret without its value.
type VaultMeta struct {
	Owner    string    `json:"owner"`
	Name     string    `json:"name"`
	Version  int       `json:"version"`
	Versions []int     `json:"versions,omitempty"` // readable versions
	Created  time.Time `json:"created"`
}

// Secret is what a sealed fetch, mint or rotate reply opens to.
type Secret struct {
	VaultMeta
	Value string `json:"value"`
}

// Identity is what a sealed identity reply opens to: a new nkey identity.
type Identity struct {
	Owner     string `json:"owner"`
	PublicKey string `json:"public_key"`
	Seed      string `json:"seed"`
}

// Token is what a sealed token reply opens to.
type Token struct {
	ID      string    `json:"id"`
	Token   string    `json:"token"` // the bearer string to hand to the joining node
	Expires time.Time `json:"expires"`
	Uses    int       `json:"uses"`
}

// Enrolment is what a sealed enrol reply opens to: what a joining node needs of the
// foundation. (The barrier key travels sealed to the node's own xkey only.)
type Enrolment struct {
	MeshID      string `json:"mesh_id"`
	RouteSecret []byte `json:"route_secret"`
	GossipKey   []byte `json:"gossip_key"`
	BarrierKey  []byte `json:"barrier_key"`
	// Expect is the number of servers the mesh was founded with (its quorum's basis);
	// Members the servers it formed with; Seeds the gossip addresses of its live members.
	Expect  int      `json:"expect,omitempty"`
	Members []string `json:"members,omitempty"`
	Seeds   []string `json:"seeds,omitempty"`
	// Growing is set when the mesh is a single node growing to Expect servers: the joining
	// node forms the mesh with it, and waits for it to bring the mesh's state.
	Growing bool `json:"growing,omitempty"`
	// CA is the mesh's CA certificate (DER), which join tokens carry.
	CA []byte `json:"ca,omitempty"`
	// Leaf are the hub servers' leafnode URLs, in a site's enrolment (which carries nothing
	// else but MeshID and CA).
	Leaf []string `json:"leaf,omitempty"`
}

// ModuleCredentials is what a sealed module reply opens to: what a host gives the module's
// processes (the seed as MESH_CREDS, the secrets as files).
type ModuleCredentials struct {
	Module    string            `json:"module"`
	PublicKey string            `json:"public_key"`
	Seed      string            `json:"seed"`
	Secrets   map[string]string `json:"secrets,omitempty"`
	// Provisions are the module's credentials of the interfaces it requires, by interface.
	Provisions map[string]Provisioned `json:"provisions,omitempty"`
}

// RecoveryKey is what a sealed recovery-key reply opens to.
type RecoveryKey struct {
	MeshID string `json:"mesh_id"`
	Key    string `json:"key"` // "MNRK1-…": the barrier key and a checksum, base32
}

// SealedFoundation is what a sealed foundation reply opens to, and what a snapshot's
// manifest carries: the mesh's route secret, gossip key and vault seed as JSON, sealed with
// AES-256-GCM (the mesh id its additional data) under a key derived by HKDF-SHA256 from the
// barrier key. Check is derived beside that key: a wrong recovery key is told apart from a
// damaged box without trying to open it.
type SealedFoundation struct {
	Version int    `json:"version"` // 1
	MeshID  string `json:"mesh_id"`
	Check   string `json:"check"` // hex
	Nonce   []byte `json:"nonce"`
	Box     []byte `json:"box"`
}

// ServerSecrets is what a sealed server reply opens to.
type ServerSecrets struct {
	BarrierKey []byte `json:"barrier_key"`
	VaultSeed  []byte `json:"vault_seed"`
}
