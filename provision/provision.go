// Package provision is provisioning over the bus (DESIGN §12): a module that requires an
// interface (`requires: [postgres]`) gets it from the seat that provides it
// (`provides: [postgres]`), whose protocol serves three tools — create, remove, holds. The
// mesh-controller's holder resolves each requirement of a deployed module to a provider,
// calls create, and has the vault keep the returned credential under the consumer's name;
// it asks holds on a timer to reconcile. The credential never travels in clear: the
// provider seals it to the vault's xkey, and the host fetches it sealed to its own.
//
// This file is the wire: what the controller asks a provider and what a provider answers.
// A provider written in Go uses Credential.Seal; one in another language seals the same
// JSON with an xkey (curve25519, nkeys) to the request's XKey.
package provision

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/vault"
)

// The provisioner tools (manifest.ProvisionerTools), as subjects' last tokens.
const (
	ToolCreate = "create"
	ToolRemove = "remove"
	ToolHolds  = "holds"
)

// KV is the interface the mesh provides itself: a JetStream key-value bucket per consumer,
// reached with the consumer's own bus identity (manifest.KVBucket names it).
const KV = manifest.RequireKV

// MeshProvider is the provider the records name for an interface the mesh provides.
const MeshProvider = deploy.MeshProvider

// CreateRequest asks a provider for one consumer's resource. XKey is the vault's xkey: the
// reply's credential is sealed to it, so only the vault can open it.
type CreateRequest struct {
	Consumer  string            `json:"consumer"`
	Interface string            `json:"interface"`
	Options   map[string]string `json:"options,omitempty"`
	XKey      string            `json:"xkey"`
}

// CreateReply is a provider's answer to create: the credential sealed to the request's
// XKey, and the xkey that sealed it. A create of a consumer the provider holds already
// answers a fresh credential for the same resource.
type CreateReply struct {
	Sealed []byte `json:"sealed"`
	Sender string `json:"sender"`
}

// RemoveRequest asks a provider to drop one consumer's resource; removing one it does not
// hold is not an error.
type RemoveRequest struct {
	Consumer  string `json:"consumer"`
	Interface string `json:"interface"`
}

// HoldsRequest asks a provider which consumers it holds a resource for.
type HoldsRequest struct {
	Interface string `json:"interface"`
}

// HoldsReply lists the consumers whose resource exists now.
type HoldsReply struct {
	Consumers []string `json:"consumers"`
}

// Credential is what a consumer is given of its provision (vault.Provisioned): its
// variables are named <INTERFACE>_<NAME> in capitals (POSTGRES_URL, POSTGRES_PASSWORD).
type Credential = vault.Provisioned

// Seal seals c to the request's xkey: a provider's create reply.
func Seal(c Credential, req CreateRequest) (CreateReply, error) {
	if err := c.Check(req.Interface); err != nil {
		return CreateReply{}, err
	}
	b, _ := json.Marshal(c)
	sealed, sender, err := vault.Seal(req.XKey, b)
	if err != nil {
		return CreateReply{}, err
	}
	return CreateReply{Sealed: sealed, Sender: sender}, nil
}

// CheckRequest refuses a create or remove whose names are not names: a provider builds
// resources (databases, roles) from them.
func CheckRequest(consumer, iface string) error {
	if !manifest.ValidName(consumer) {
		return fmt.Errorf("consumer %q is not a module name", consumer)
	}
	if !manifest.ValidName(iface) {
		return fmt.Errorf("interface %q is not an interface name", iface)
	}
	return nil
}

// The states of a provision, as `meshnode provisions` says them.
const (
	StateWaiting = "waiting" // no provider resolved or answering yet: the consumer is not started
	StateReady   = "ready"   // created, its credential kept by the vault
	StateFailed  = "failed"  // the provider refused or answered badly; tried again
)

// Record is one consumer's provision of one interface (api.Provision), as the controller
// keeps it in the Bucket under Key(consumer, interface): the registry answers it without
// importing provision.
type Record = api.Provision

// Key is a record's key in the Bucket.
func Key(consumer, iface string) string { return consumer + "." + iface }

// Bucket keeps the provision records (key-value, the mesh's replicas).
const Bucket = "mesh-provisions"

// Want is one interface a deployed module requires, resolved to its provider; Problem says
// why it has none (then Provider is empty).
type Want struct {
	Consumer  string
	Interface string
	Options   map[string]string // the manifest's, for the provider's create
	Provider  string
	Problem   string
}

// Key is the want's record key.
func (w Want) Key() string { return Key(w.Consumer, w.Interface) }

// Resolve returns what m requires of provisions (every interface but mesh-bus), each with
// its provider: the mesh for kv; otherwise the one seat of the catalogue that provides it,
// or, when several do, the one choices names (a pin, `meshnode provisions pin`). It is pure.
func Resolve(m *manifest.Manifest, catalogue []*manifest.Manifest, choices map[string]string) []Want {
	var out []Want
	for _, iface := range m.Requires {
		if iface == manifest.RequireBus {
			continue
		}
		w := Want{Consumer: m.Module, Interface: iface, Options: m.Options[iface]}
		providers := manifest.Providers(iface, append([]*manifest.Manifest{m}, catalogue...))
		choice, chosen := choices[iface]
		switch {
		case iface == manifest.RequireKV:
			w.Provider = MeshProvider
		case chosen && slices.Contains(providers, choice):
			w.Provider = choice
		case chosen:
			w.Problem = fmt.Sprintf("the chosen provider %s does not provide %s (%s do): choose again with `meshnode provisions pin %s %s SEAT`",
				choice, iface, orNone(providers), m.Module, iface)
		case len(providers) == 1:
			w.Provider = providers[0]
		case len(providers) == 0:
			w.Problem = fmt.Sprintf("no seat provides %s yet: register a module whose seat has provides: [%s]", iface, iface)
		default:
			w.Problem = fmt.Sprintf("seats %s all provide %s: choose one with `meshnode provisions pin %s %s SEAT`",
				strings.Join(providers, ", "), iface, m.Module, iface)
		}
		out = append(out, w)
	}
	return out
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
