package api

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

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

// The provisioner tools (manifest.ProvisionerTools), as subjects' last tokens.
const (
	ProvisionToolCreate = "create"
	ProvisionToolRemove = "remove"
	ProvisionToolHolds  = "holds"
)

// ProvisionCreateRequest asks a provider for one consumer's resource. XKey is the vault's
// xkey: the reply's credential is sealed to it, so only the vault can open it.
type ProvisionCreateRequest struct {
	Consumer  string            `json:"consumer"`
	Interface string            `json:"interface"`
	Options   map[string]string `json:"options,omitempty"`
	XKey      string            `json:"xkey"`
}

// ProvisionCreateReply is a provider's answer to create: the credential sealed to the
// request's XKey, and the xkey that sealed it. A create of a consumer the provider holds
// already answers a fresh credential for the same resource.
type ProvisionCreateReply struct {
	Sealed []byte `json:"sealed"`
	Sender string `json:"sender"`
}

// ProvisionRemoveRequest asks a provider to drop one consumer's resource; removing one it
// does not hold is not an error.
type ProvisionRemoveRequest struct {
	Consumer  string `json:"consumer"`
	Interface string `json:"interface"`
}

// ProvisionHoldsRequest asks a provider which consumers it holds a resource for.
type ProvisionHoldsRequest struct {
	Interface string `json:"interface"`
}

// ProvisionHoldsReply lists the consumers whose resource exists now.
type ProvisionHoldsReply struct {
	Consumers []string `json:"consumers"`
}

// Provisioned is what a provider's sealed create reply opens to (DESIGN §12): what the
// consumer of an interface is given — connection facts and the secret as environment
// variables, each named <INTERFACE>_<NAME> in capitals (POSTGRES_URL): nothing else reaches
// the consumer's process. The vault keeps it, barrier-encrypted, as the consumer's
// vault.ProvisionName(interface).
type Provisioned struct {
	Env map[string]string `json:"env"`
}

// maxProvisionedValue bounds one variable of a credential.
const maxProvisionedValue = 4096

// EnvNames are the names a credential's variables may have after the interface's prefix:
// connection facts and secrets, nothing a process or its runtime reads on its own
// (LD_PRELOAD, NODE_OPTIONS, HTTP_PROXY, GIT_SSH_COMMAND …), and no name of another
// interface's (MY_DB_URL is my-db's, not my's).
var EnvNames = []string{"URL", "HOST", "PORT", "USER", "PASSWORD", "DATABASE", "TOKEN", "SECRET", "KEY", "NAME", "ENDPOINT", "REGION", "SSLMODE", "CA"}

// EnvPrefix is the prefix of every variable of an interface's credential: POSTGRES_ for
// postgres, MY_DB_ for my-db.
func EnvPrefix(iface string) string {
	return strings.ToUpper(strings.ReplaceAll(iface, "-", "_")) + "_"
}

// Check refuses a credential a consumer could not be given: no variables, a name outside the
// interface's prefix, or too large a value.
func (p Provisioned) Check(iface string) error {
	prefix := EnvPrefix(iface)
	if len(p.Env) == 0 {
		return fmt.Errorf("the %s credential has no variables: a provider answers at least %sURL", iface, prefix)
	}
	for _, k := range slices.Sorted(maps.Keys(p.Env)) {
		if name, ok := strings.CutPrefix(k, prefix); !ok || !slices.Contains(EnvNames, name) {
			return fmt.Errorf("the %s credential names %q: its variables are %s followed by one of %s", iface, k, prefix, strings.Join(EnvNames, ", "))
		}
		if len(p.Env[k]) > maxProvisionedValue {
			return fmt.Errorf("the %s credential's %s is %d bytes (at most %d)", iface, k, len(p.Env[k]), maxProvisionedValue)
		}
	}
	return nil
}
