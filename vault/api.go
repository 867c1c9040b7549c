package vault

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Callers that are not modules. A module calls as ModuleCaller(its name), a separate
// namespace, so no module name can pass for an administrator.
const (
	CallerOperator = "operator"
	CallerNode     = "node"
)

// ModuleCaller is how module calls the vault: mod.<module>.
func ModuleCaller(module string) string { return "mod." + module }

// The vault's verbs: core request/reply on mesh.seat.mesh-vault.tool.<verb>.<caller>. The
// caller in the subject is the proof of who asks: a module may publish only on
// fetch.mod.<its name>, a join token's key only on enrol.<its id>; the operator and the nodes
// (operator, node) administer.
const (
	VerbMint     = "mint"
	VerbFetch    = "fetch"
	VerbRotate   = "rotate"
	VerbList     = "ls"
	VerbToken    = "token"
	VerbEnrol    = "enrol"
	VerbIdentity = "identity"
	// VerbServer hands another server of the mesh the vault's own credentials (the barrier
	// key and the vault's bus identity), sealed to that node's xkey, so it can serve the
	// vault seat too. Only the nodes (and the operator) may ask.
	VerbServer = "server"
	// VerbModule hands a server the credentials of a module its declaration says it runs —
	// the module's seed and the secrets the declaration names — sealed to that server's
	// recorded xkey. Only the nodes ask.
	VerbModule = "module"
	// VerbIntake answers the vault's intake xkey (public): a provider seals the credential
	// it creates to it, the operator a value it gives a secret (mint and rotate carry it
	// sealed). The operator and the nodes ask. VerbProvision hands the vault such a sealed credential to keep under
	// its consumer; VerbUnprovision drops it. Only the nodes (the controller's holder) ask.
	VerbIntake      = "intake"
	VerbProvision   = "provision"
	VerbUnprovision = "unprovision"
)

// nodeOnly reports whether only the nodes may ask verb (and need no xkey: nothing secret
// is answered).
func nodeOnly(verb string) bool { return verb == VerbProvision || verb == VerbUnprovision }

// ModuleCredentials is what a sealed module reply opens to: what a host gives the module's
// processes (the seed as MESH_CREDS, the secrets as files).
type ModuleCredentials struct {
	Module    string            `json:"module"`
	PublicKey string            `json:"public_key"`
	Seed      string            `json:"seed"`
	Secrets   map[string]string `json:"secrets,omitempty"`
	// Provisions are the module's credentials of the interfaces it requires, by interface.
	Provisions map[string]api.Provisioned `json:"provisions,omitempty"`
}

// ServerSecrets is what a sealed server reply opens to.
type ServerSecrets struct {
	BarrierKey []byte `json:"barrier_key"`
	VaultSeed  []byte `json:"vault_seed"`
}

// ToolSubject is where caller asks the vault for verb.
func ToolSubject(verb, caller string) string {
	return manifest.SeatToolSubject(manifest.VaultSeat, verb) + "." + caller
}

// EventSubject is where the vault records an action: mesh.seat.mesh-vault.event.<action>.
func EventSubject(action string) string { return manifest.SeatEventSubject(manifest.VaultSeat, action) }

// Request is any vault request. XKey is the caller's xkey public key: every reply that
// carries a secret is sealed to it.
type Request struct {
	XKey    string `json:"xkey"`
	Owner   string `json:"owner,omitempty"` // a module, or "operator"; a module's fetch is its own
	Name    string `json:"name,omitempty"`
	Version int    `json:"version,omitempty"` // fetch: 0 = current
	Grace   string `json:"grace,omitempty"`   // rotate: how long the previous version stays readable
	TTL     string `json:"ttl,omitempty"`     // token: validity
	Uses    int    `json:"uses,omitempty"`    // token: how many joins
	Node    string `json:"node,omitempty"`    // enrol: the joining node's name
	MeshID  string `json:"mesh_id,omitempty"` // enrol: the mesh the token names
	// provision, mint, rotate: a credential or value sealed to the vault's intake xkey, and
	// who sealed it.
	Sealed []byte `json:"sealed,omitempty"`
	Sender string `json:"sender,omitempty"`
}

// Reply is any vault reply: Sealed (to the request's XKey, opened with Sender) when it
// carries a secret, Meta otherwise, Error when refused.
type Reply struct {
	// PublicKey is a minted identity's public key (identity): public, so unsealed.
	PublicKey string `json:"public_key,omitempty"`
	Sealed    []byte `json:"sealed,omitempty"`
	Sender    string `json:"sender,omitempty"`
	Meta      []Meta `json:"meta,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Meta describes a secret without its value.
type Meta struct {
	Owner    string    `json:"owner"`
	Name     string    `json:"name"`
	Version  int       `json:"version"`
	Versions []int     `json:"versions,omitempty"` // readable versions
	Created  time.Time `json:"created"`
}

// Secret is what a sealed fetch, mint or rotate reply opens to.
type Secret struct {
	Meta
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
}

// ErrRefused means the vault refused the request; the error says why.
var ErrRefused = errors.New("vault refused")

// Call sends req as caller for verb and opens the sealed reply, if any, into out. It makes a
// one-time xkey for the reply, so only this call can open it.
func Call(ctx context.Context, nc *nats.Conn, verb, caller string, req Request, out any) ([]Meta, error) {
	xkp, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, err
	}
	defer xkp.Wipe()
	req.XKey, _ = xkp.PublicKey()
	return CallWith(ctx, nc, xkp, verb, caller, req, out)
}

// CallWith is Call with the caller's own xkey (req.XKey must be its public key).
func CallWith(ctx context.Context, nc *nats.Conn, xkp Opener, verb, caller string, req Request, out any) ([]Meta, error) {
	b, _ := json.Marshal(req)
	subject := ToolSubject(verb, caller)
	msg, err := nc.RequestWithContext(ctx, subject, b)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("no vault answers %s: is the node ready (`meshnode status`)?", subject)
	}
	if err != nil {
		return nil, fmt.Errorf("vault %s: %w", verb, err)
	}
	var reply Reply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, fmt.Errorf("vault %s answered %q: %w", verb, msg.Data, err)
	}
	if reply.Error != "" {
		return nil, fmt.Errorf("%w: %s", ErrRefused, reply.Error)
	}
	if reply.Sealed != nil && out != nil {
		plain, err := Unseal(xkp, reply.Sender, reply.Sealed)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(plain, out); err != nil {
			return nil, fmt.Errorf("vault %s: sealed reply: %w", verb, err)
		}
	}
	return reply.Meta, nil
}

// IntakeKey asks the vault, as caller (the operator or a node), for its intake xkey.
func IntakeKey(ctx context.Context, nc *nats.Conn, caller string) (string, error) {
	msg, err := nc.RequestWithContext(ctx, ToolSubject(VerbIntake, caller), []byte("{}"))
	if errors.Is(err, nats.ErrNoResponders) {
		return "", fmt.Errorf("no vault answers %s: is the node ready (`meshnode status`)?", VerbIntake)
	}
	if err != nil {
		return "", fmt.Errorf("vault %s: %w", VerbIntake, err)
	}
	var reply Reply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return "", fmt.Errorf("vault %s answered %q: %w", VerbIntake, msg.Data, err)
	}
	if reply.Error != "" || !nkeys.IsValidPublicCurveKey(reply.PublicKey) {
		return "", fmt.Errorf("%w: %s", ErrRefused, reply.Error)
	}
	return reply.PublicKey, nil
}

// Give seals value to the vault's intake key into req, for a mint or rotate that sets it
// instead of a random one: the value travels sealed, and no stream ever holds it.
func Give(ctx context.Context, nc *nats.Conn, caller string, req *Request, value []byte) error {
	key, err := IntakeKey(ctx, nc, caller)
	if err != nil {
		return err
	}
	req.Sealed, req.Sender, err = Seal(key, value)
	return err
}
