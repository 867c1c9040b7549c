// Package provision is provisioning over the bus (DESIGN §12): a module that requires an
// interface (`requires: [postgres]`) gets it from the seat that provides it
// (`provides: [postgres]`), whose protocol serves three tools — create, remove, holds. The
// mesh-controller's holder resolves each requirement of a deployed module to a provider,
// calls create, and has the vault keep the returned credential under the consumer's name;
// it asks holds on a timer to reconcile. The credential never travels in clear: the
// provider seals it to the vault's xkey, and the host fetches it sealed to its own.
//
// This file is the wire: what the controller asks a provider and what a provider answers.
// A provider written in Go uses Seal; one in another language seals the same
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

// KV is the interface the mesh provides itself: a JetStream key-value bucket per consumer,
// reached with the consumer's own bus identity (manifest.KVBucket names it).
const KV = manifest.RequireKV

// MeshProvider is the provider the records name for an interface the mesh provides.
const MeshProvider = deploy.MeshProvider

// Seal seals c to the request's xkey: a provider's create reply.
func Seal(c api.Provisioned, req api.ProvisionCreateRequest) (api.ProvisionCreateReply, error) {
	if err := c.Check(req.Interface); err != nil {
		return api.ProvisionCreateReply{}, err
	}
	b, _ := json.Marshal(c)
	sealed, sender, err := vault.Seal(req.XKey, b)
	if err != nil {
		return api.ProvisionCreateReply{}, err
	}
	return api.ProvisionCreateReply{Sealed: sealed, Sender: sender}, nil
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
