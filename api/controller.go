package api

import (
	"encoding/json"
	"time"

	"github.com/meshnode/meshnode/manifest"
)

// The registry's tools: core request/reply on the mesh-controller seat, answered by the
// controller of the node holding that seat. Operators (the CLI) register and remove; any
// registered module may ask whoami, the one question a client holding only its seed must ask
// before it knows its own name.

// The controller's tools, core request/reply on mesh.seat.mesh-controller.tool.<verb>.
var (
	RegisterSubject = manifest.SeatToolSubject(manifest.ControllerSeat, "register")
	RemoveSubject   = manifest.SeatToolSubject(manifest.ControllerSeat, "remove")
	ListSubject     = manifest.SeatToolSubject(manifest.ControllerSeat, "list")
	PinSubject      = manifest.SeatToolSubject(manifest.ControllerSeat, "pin")
	DeploySubject   = manifest.SeatToolSubject(manifest.ControllerSeat, "deploy")
	UndeploySubject = manifest.SeatToolSubject(manifest.ControllerSeat, "undeploy")
	PsSubject       = manifest.SeatToolSubject(manifest.ControllerSeat, "ps")
	BuildsSubject   = manifest.SeatToolSubject(manifest.ControllerSeat, "builds")
	// ProvisionsSubject answers `meshnode provisions`.
	ProvisionsSubject = manifest.SeatToolSubject(manifest.ControllerSeat, "provisions")
)

// RegisterRequest registers or re-registers a module.
type RegisterRequest struct {
	// Manifest is the manifest's YAML.
	Manifest string `json:"manifest"`
	// XKey is the caller's xkey public key: a new module's seed is sealed to it.
	XKey string `json:"xkey"`
	// RotateKey asks, for a module already registered, for a new key in place of its old
	// one (a lost seed): the vault mints it, the registry records it, the old key's
	// connections are kicked, and the reply carries the new seed as for a new module.
	RotateKey bool `json:"rotate_key,omitempty"`
}

// RegisterReply answers RegisterRequest.
type RegisterReply struct {
	Module    string `json:"module,omitempty"`
	PublicKey string `json:"public_key,omitempty"`
	// Created is true for a new module: SealedSeed then holds its identity (Identity
	// as JSON, minted by the vault), sealed to the request's XKey with the one-time sender key
	// SenderXKey. A re-registration keeps the
	// module's key and sends no seed, unless it asked to rotate the key: then Rotated is
	// true and SealedSeed holds the new identity.
	Created    bool   `json:"created"`
	Rotated    bool   `json:"rotated,omitempty"`
	SealedSeed []byte `json:"sealed_seed,omitempty"`
	SenderXKey string `json:"sender_xkey,omitempty"`
	// Kept lists seat streams left in place for their queued work.
	Kept []string `json:"kept,omitempty"`
	// Error is set when the registration was refused; Refusals then lists every reason.
	Error    string             `json:"error,omitempty"`
	Refusals []manifest.Refusal `json:"refusals,omitempty"`
	// Derived is what the mesh derived from the manifest (manifest.Derivation as JSON), for
	// the operator to read.
	Derived json.RawMessage `json:"derived,omitempty"`
}

// RemoveRequest removes a module.
type RemoveRequest struct {
	Module string `json:"module"`
	// Force removes a module that declares a seat other modules are bound to; the removal's
	// event names them.
	Force bool `json:"force,omitempty"`
}

// RemoveReply answers RemoveRequest.
type RemoveReply struct {
	Module string   `json:"module,omitempty"`
	Kept   []string `json:"kept,omitempty"`
	Error  string   `json:"error,omitempty"`
}

// PinRequest moves a module to a version of the protocol of a seat it uses, or whose events
// it consumes by name (`meshnode seat pin MODULE SEAT VERSION`).
type PinRequest struct {
	Module  string `json:"module"`
	Seat    string `json:"seat"`
	Version string `json:"version"` // v1 … v9
}

// PinReply answers PinRequest.
type PinReply struct {
	Module   string `json:"module,omitempty"`
	Seat     string `json:"seat,omitempty"`
	Version  string `json:"version,omitempty"`
	Previous string `json:"previous,omitempty"` // the version it was pinned to before
	// Retirable is true when no module is bound to Previous any more.
	Retirable bool   `json:"retirable,omitempty"`
	Error     string `json:"error,omitempty"`
}

// DeployRequest sets where and what a module runs (`meshnode deploy`): Digest is filled in
// by the controller from the artifact store.
type DeployRequest struct {
	Module     string     `json:"module"`
	Deployment Deployment `json:"deployment"`
}

// UndeployRequest stops a module on Nodes, or everywhere when Nodes is empty.
type UndeployRequest struct {
	Module string   `json:"module"`
	Nodes  []string `json:"nodes,omitempty"`
}

// DeployReply answers DeployRequest and UndeployRequest: the deployment now (nil when
// undeployed) and each affected node's declaration revision.
type DeployReply struct {
	Module     string      `json:"module,omitempty"`
	Deployment *Deployment `json:"deployment,omitempty"`
	Declared   []Declared  `json:"declared,omitempty"`
	Error      string      `json:"error,omitempty"`
}

// Declared is one node's declaration after a change: its revision, and whether it changed.
type Declared struct {
	Node     string `json:"node"`
	Revision uint64 `json:"revision"`
	Changed  bool   `json:"changed"`
	Error    string `json:"error,omitempty"` // the declaration could not be published (retried)
}

// Process is one module instance on one node, as `meshnode ps` shows it: from the node's
// latest report, against the declaration published for it.
type Process struct {
	Module   string `json:"module"`
	Node     string `json:"node"`
	Version  string `json:"version"`
	Instance int    `json:"instance"`
	// Revision is the declaration the node applied; Declared the one published for it (when
	// it is higher, the node is behind).
	Revision uint64    `json:"revision"`
	Declared uint64    `json:"declared"`
	State    string    `json:"state"`
	PID      int       `json:"pid,omitempty"`
	Restarts int       `json:"restarts"`
	Since    time.Time `json:"since,omitzero"`
	Reason   string    `json:"reason,omitempty"`
	Reported time.Time `json:"reported,omitzero"`
	// Isolation is what the running process got, read back from the kernel when its node
	// last reported (DESIGN §13).
	Isolation *Isolation `json:"isolation,omitempty"`
}

// PsReply answers a PsSubject request.
type PsReply struct {
	Processes []Process `json:"processes"`
	Error     string    `json:"error,omitempty"`
}

// Build is one build of the cascade, as `meshnode builds` lists it.
type Build struct {
	Module   string    `json:"module"`
	Status   string    `json:"status"` // queued, built, failed
	Version  string    `json:"version,omitempty"`
	Digest   string    `json:"digest,omitempty"`
	Commit   string    `json:"commit"`
	Started  time.Time `json:"started"` // when its job was queued
	Finished time.Time `json:"finished,omitzero"`
	// Trigger says why it was built: "pushed <repository> <ref>", or "built <module>
	// <version>" for a rebuild on a new upstream; Cascade is the event that started the
	// cascade (its x-event-id), Cause the event that queued this build.
	Trigger string `json:"trigger"`
	Cascade string `json:"cascade"`
	Cause   string `json:"cause"`
	Reason  string `json:"reason,omitempty"` // a failed build's
}

// ProvideSubject chooses the seat that provides a module's required interface.
var ProvideSubject = manifest.SeatToolSubject(manifest.ControllerSeat, "provide")

// ProvideRequest chooses Provider (a seat) for Module's required Interface.
type ProvideRequest struct {
	Module    string `json:"module"`
	Interface string `json:"interface"`
	Provider  string `json:"provider"`
}

// ProvideReply answers ProvideRequest.
type ProvideReply struct {
	Module    string `json:"module,omitempty"`
	Interface string `json:"interface,omitempty"`
	Provider  string `json:"provider,omitempty"`
	Previous  string `json:"previous,omitempty"`
	Error     string `json:"error,omitempty"`
}

// ProvisionsReply answers a ProvisionsSubject request: one record per deployed consumer and
// interface it requires (besides mesh-bus), sorted.
type ProvisionsReply struct {
	Provisions []Provision `json:"provisions"`
	Error      string      `json:"error,omitempty"`
}

// BuildsReply answers a BuildsSubject request: the latest builds, oldest first.
type BuildsReply struct {
	Builds []Build `json:"builds"`
	Error  string  `json:"error,omitempty"`
}

// ModuleInfo is one registered module, as list reports it.
type ModuleInfo struct {
	Module       string            `json:"module"`
	PublicKey    string            `json:"public_key"`
	Emits        []string          `json:"emits"`
	Consumes     []string          `json:"consumes"`
	Tools        []string          `json:"tools"`
	Uses         []string          `json:"uses"`
	Seats        []string          `json:"seats"`
	Fingerprints map[string]string `json:"fingerprints,omitempty"`
	// Pins are the later seat protocol versions the module speaks, by seat.
	Pins map[string]string `json:"pins,omitempty"`
	// Deployment is where and what it runs; nil when not deployed.
	Deployment *Deployment `json:"deployment,omitempty"`
	Registered time.Time   `json:"registered"`
	Updated    time.Time   `json:"updated"`
	Revision   uint64      `json:"revision"`
	// Manifest is the manifest's YAML as registered (at most manifest.MaxSize bytes).
	Manifest string `json:"manifest"`
	// Quota is its use of EVENTS against its quota, as the answering node's admitter sees it.
	Quota *QuotaUse `json:"quota,omitempty"`
}

// ListRequest asks for one page of the registered modules, in name order: a page is sized to
// fit the bus's payload limit however many modules there are.
type ListRequest struct {
	// After is the last module of the previous page; "" for the first page.
	After string `json:"after,omitempty"`
}

// ListReply answers a list request: one page, since the modules of a large mesh would not
// fit one reply.
type ListReply struct {
	Modules []ModuleInfo `json:"modules"`
	// Next is the After of the next page; "" when this page is the last.
	Next  string `json:"next,omitempty"`
	Error string `json:"error,omitempty"`
}

// ListPageBytes bounds the modules of one list page, in bytes of JSON: half the bus's 1 MiB
// payload limit. A page holds at least one module, whose entry a manifest of at most
// manifest.MaxSize keeps under it.
const ListPageBytes = 512 << 10

// WhoamiSubject is where the holder of publicKey asks the controller which module it is:
// mesh.seat.mesh-controller.tool.whoami.<key>. Only that key may publish there, so the
// subject proves who asks (and whose rate limit a request counts against).
func WhoamiSubject(publicKey string) string { return manifest.WhoamiSubject(publicKey) }

// BootstrapInbox is the inbox on which the holder of publicKey receives whoami's answer:
// keyed by the public key, because before the answer the client does not know its name.
func BootstrapInbox(publicKey string) string { return manifest.BootstrapInbox(publicKey) }

// WhoamiRequest asks which module a key is.
type WhoamiRequest struct {
	PublicKey string `json:"public_key"`
}

// WhoamiReply answers WhoamiRequest: the module and what it declared, so a client can refuse
// an undeclared call itself, with a clear error, before the bus does.
type WhoamiReply struct {
	Module   string     `json:"module,omitempty"`
	Node     string     `json:"node,omitempty"`
	Emits    []string   `json:"emits,omitempty"`
	Consumes []string   `json:"consumes,omitempty"`
	Tools    []string   `json:"tools,omitempty"`
	Secrets  []string   `json:"secrets,omitempty"`
	Requires []string   `json:"requires,omitempty"`
	Uses     []SeatInfo `json:"uses,omitempty"`
	Seats    []SeatInfo `json:"seats,omitempty"`
	// Signers are the keys of every source whose events the module consumes: what its
	// client checks a delivered event's signature against.
	Signers Signers `json:"signers,omitempty"`
	Error   string  `json:"error,omitempty"`
}

// Signers are public keys of event sources, by SignerKey: a module's own, a seat's (its
// declaring module's; the vault's for mesh-vault), each server's, and those of the modules
// that may submit jobs to the asker's seats (kind job).
type Signers map[string]string

// The kinds of source a Signers key names.
const (
	SignerModule = "mod"
	SignerSeat   = "seat"
	SignerNode   = "node"
	// SignerJob names a module that may submit jobs to a seat the asker declares.
	SignerJob = "job"
)

// SignerKey is the key of a source in Signers: "<kind>:<name>".
func SignerKey(kind, name string) string { return kind + ":" + name }

// SetError sets the reply's refusal (the controller's tools).
func (r *PinReply) SetError(e string) { r.Error = e }

// SetError sets the reply's refusal.
func (r *DeployReply) SetError(e string) { r.Error = e }

// SetError sets the reply's refusal.
func (r *ProvideReply) SetError(e string) { r.Error = e }
