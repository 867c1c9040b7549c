// Package deploy is deployment as state (DESIGN §12): what the operator asks for (a
// Deployment per module, kept in the registry), what the mesh-controller holder composes
// from it for each node (a Declaration: the whole set of modules the node must run), and how
// a declaration is signed by the controller's node and checked by the node it is for. The
// functions here are pure where they can be: composing and checking take their inputs and
// touch nothing.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// MaxInstances bounds a deployment's processes per node.
const MaxInstances = 16

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckDeployment refuses a deployment that cannot be run: a bad version, no nodes, instances out of
// range, an environment name that is not one or that the host sets itself (MESH_*).
func CheckDeployment(d *api.Deployment) error {
	if err := artifact.CheckVersion(d.Version); err != nil {
		return err
	}
	if !d.All && len(d.Nodes) == 0 {
		return errors.New("name the nodes to run on (--nodes a,b) or --all")
	}
	if d.All && len(d.Nodes) > 0 {
		return errors.New("--all and --nodes exclude each other")
	}
	for _, n := range d.Nodes {
		if !manifest.ValidName(n) {
			return fmt.Errorf("node %q is not a node name", n)
		}
	}
	if d.Instances < 1 || d.Instances > MaxInstances {
		return fmt.Errorf("instances %d: between 1 and %d", d.Instances, MaxInstances)
	}
	for _, k := range slices.Sorted(maps.Keys(d.Env)) {
		switch {
		case !envName.MatchString(k):
			return fmt.Errorf("environment name %q: letters, digits and '_', not starting with a digit", k)
		case strings.HasPrefix(k, "MESH_"):
			return fmt.Errorf("environment name %s: MESH_* are the host's own (MESH_URL, MESH_CREDS, MESH_NODE, MESH_MODULE, MESH_SECRETS, MESH_INSTANCE, MESH_CA)", k)
		}
	}
	return nil
}

// Module is one module in a node's declaration: everything the host needs to run it, and no
// secret (secret names only).
type Module struct {
	Module string `json:"module"`
	// PublicKey is the module's identity: the host checks the seed it fetches against it.
	PublicKey string            `json:"public_key"`
	Version   string            `json:"version"`
	Digest    string            `json:"digest"`
	Instances int               `json:"instances"`
	Env       map[string]string `json:"env,omitempty"`
	Args      []string          `json:"args,omitempty"`
	Secrets   []string          `json:"secrets,omitempty"`
	// Provisions are the interfaces the module requires, each ready at its provider: the
	// host fetches their credentials with the module's (a provider the mesh is has none).
	Provisions []Provision `json:"provisions,omitempty"`
	// Waiting names the first provision not ready ("postgres from postgres"): the host
	// does not start the module, and reports it waiting on that.
	Waiting string `json:"waiting,omitempty"`
	// Limits are its manifest's limits on each instance; a zero field is the node's default.
	Limits manifest.Limits `json:"limits,omitzero"`
}

// MeshProvider is the provider of the interfaces the mesh provides itself (kv).
const MeshProvider = "mesh"

// Provision is one ready provision of a module: the interface, the seat that provides it
// (MeshProvider for the mesh's own), and its generation, which rises with each create, so a
// re-created resource (a new credential) restarts the module.
type Provision struct {
	Interface  string `json:"interface"`
	Provider   string `json:"provider"`
	Generation uint64 `json:"generation"`
}

// Declaration is the whole set of modules one node must run, as the controller published it
// on mesh.state.node.<node>. Revision rises by one with each declaration for the node;
// Epoch is the controller seat's epoch when it was composed; Controller the node that
// composed and signed it.
type Declaration struct {
	Node       string    `json:"node"`
	Revision   uint64    `json:"revision"`
	Epoch      uint64    `json:"epoch"`
	Controller string    `json:"controller"`
	Composed   time.Time `json:"composed"`
	Modules    []Module  `json:"modules"`
}

// Module returns the declaration's entry for module.
func (d *Declaration) Module(module string) (Module, bool) {
	i := slices.IndexFunc(d.Modules, func(m Module) bool { return m.Module == module })
	if i < 0 {
		return Module{}, false
	}
	return d.Modules[i], true
}

// Deployed is one registered module with its deployment: Compose's input.
type Deployed struct {
	Module     string
	PublicKey  string
	Secrets    []string
	Deployment *api.Deployment
	// Provisions are the module's ready provisions; Waiting the first one that is not
	// ("postgres from postgres"), empty when none waits.
	Provisions []Provision
	Waiting    string
	Limits     manifest.Limits
}

// Compose returns the modules node must run: every deployed module whose deployment targets
// it, sorted by name. It is pure: the same input composes the same modules.
func Compose(node string, deployed []Deployed) []Module {
	out := []Module{}
	for _, d := range deployed {
		if !d.Deployment.Targets(node) {
			continue
		}
		out = append(out, Module{
			Module: d.Module, PublicKey: d.PublicKey, Version: d.Deployment.Version, Digest: d.Deployment.Digest,
			Instances: d.Deployment.Instances, Env: d.Deployment.Env, Args: d.Deployment.Args,
			Secrets: slices.Clone(d.Secrets), Provisions: slices.Clone(d.Provisions), Waiting: d.Waiting, Limits: d.Limits,
		})
	}
	slices.SortFunc(out, func(a, b Module) int { return strings.Compare(a.Module, b.Module) })
	return out
}

// SameModules reports whether two module lists declare the same thing: a node whose
// modules did not change gets no new declaration.
func SameModules(a, b []Module) bool {
	return slices.EqualFunc(a, b, func(x, y Module) bool {
		return x.Module == y.Module && x.PublicKey == y.PublicKey && x.Version == y.Version && x.Digest == y.Digest &&
			x.Instances == y.Instances && maps.Equal(x.Env, y.Env) && slices.Equal(x.Args, y.Args) && slices.Equal(x.Secrets, y.Secrets) &&
			slices.Equal(x.Provisions, y.Provisions) && x.Waiting == y.Waiting && x.Limits == y.Limits
	})
}

// Sign stamps a declaration's body for its node's subject with the controller node's key:
// the envelope's headers (x-source the controller's node, x-signature over subject, headers
// and body).
func Sign(key envelope.Signer, controller string, d Declaration, body []byte) (nats.Header, error) {
	return envelope.Stamp(key, controller, controller, manifest.StateSubject(d.Node), body, envelope.Options{})
}

// Errors of checking a declaration.
var (
	// ErrStale means the declaration is not newer than the one the node applied last: a
	// replay, or a controller behind.
	ErrStale = errors.New("stale declaration")
	// ErrOlderEpoch is the ErrStale of a declaration newer than the one applied but signed
	// at an older controller epoch: a deposed controller's — or, when the seat's lease says
	// its signer holds the seat at that epoch now, the current holder's after the leases'
	// bucket was made again and its epochs began again (the host accepts it then).
	ErrOlderEpoch = fmt.Errorf("%w: older controller epoch", ErrStale)
	// ErrForged means the declaration is not signed by a server of the mesh, or not for
	// this node.
	ErrForged = errors.New("declaration not signed by the mesh's controller")
)

// ServerKey returns a server's public nkey by name; ok is false for a name that is no
// server of the mesh.
type ServerKey func(name string) (string, bool)

// Check reads and checks a declaration delivered on subject for node: signed by a server of
// the mesh (the controller's node) over this very subject, for node, newer than last (the
// revision and the controller epoch of the one applied last; zero for none). The
// declaration is returned with the error when it decoded, so a refusal can name it.
func Check(node, subject string, h nats.Header, body []byte, servers ServerKey, last Declaration) (Declaration, error) {
	var d Declaration
	if subject != manifest.StateSubject(node) {
		return d, fmt.Errorf("%w: %s is not node %s's subject", ErrForged, subject, node)
	}
	if err := decode(body, &d); err != nil {
		return d, fmt.Errorf("%w: %w", ErrForged, err)
	}
	signer := h.Get(envelope.Source)
	key, ok := servers(signer)
	if !ok {
		return d, fmt.Errorf("%w: x-source %q is not a server of the mesh", ErrForged, signer)
	}
	if err := envelope.Verify(h, subject, body, key); err != nil {
		return d, fmt.Errorf("%w: %w", ErrForged, err)
	}
	switch {
	case d.Node != node:
		return d, fmt.Errorf("%w: it declares node %q, and this is %s", ErrForged, d.Node, node)
	case d.Controller != signer:
		return d, fmt.Errorf("%w: it names controller %q and is signed by %s", ErrForged, d.Controller, signer)
	case d.Revision <= last.Revision:
		return d, fmt.Errorf("%w: revision %d, and revision %d is applied", ErrStale, d.Revision, last.Revision)
	case d.Epoch < last.Epoch:
		return d, fmt.Errorf("%w: %d, and revision %d was at %d", ErrOlderEpoch, d.Epoch, last.Revision, last.Epoch)
	}
	return d, nil
}

// decode reads a declaration: untrusted bytes, checked for everything a host relies on.
func decode(body []byte, d *Declaration) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(d); err != nil {
		return fmt.Errorf("not a declaration: %w", err)
	}
	if !manifest.ValidName(d.Node) || !manifest.ValidName(d.Controller) || d.Revision == 0 {
		return errors.New("not a declaration: node, controller and revision are required")
	}
	seen := map[string]bool{}
	for _, m := range d.Modules {
		switch {
		case !manifest.ValidName(m.Module) || seen[m.Module]:
			return fmt.Errorf("module %q is not a module name, or declared twice", m.Module)
		case !artifact.ValidDigest(m.Digest):
			return fmt.Errorf("module %s: digest %q is not sha256:<hex>", m.Module, m.Digest)
		case m.Instances < 1 || m.Instances > MaxInstances:
			return fmt.Errorf("module %s: instances %d", m.Module, m.Instances)
		case !nkeys.IsValidPublicUserKey(m.PublicKey):
			return fmt.Errorf("module %s: %q is not a user public key", m.Module, m.PublicKey)
		}
		if err := artifact.CheckVersion(m.Version); err != nil {
			return fmt.Errorf("module %s: %w", m.Module, err)
		}
		for _, s := range m.Secrets {
			if !manifest.ValidName(s) {
				return fmt.Errorf("module %s: secret %q is not a secret name", m.Module, s)
			}
		}
		for _, p := range m.Provisions {
			if !manifest.ValidName(p.Interface) || (p.Provider != MeshProvider && !manifest.ValidName(p.Provider)) {
				return fmt.Errorf("module %s: provision %q from %q is not an interface and a seat", m.Module, p.Interface, p.Provider)
			}
		}
		seen[m.Module] = true
	}
	return nil
}
