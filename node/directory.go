package node

import (
	"reflect"

	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
)

// directory tells the bus who a key is: the node itself and the operator administer; a
// registered module gets what its manifest derives, and nothing else.
type directory struct {
	static map[string]embedbus.Identity
	reg    *registry.Registry
}

var _ embedbus.Directory = (*directory)(nil)

func (d *directory) Identity(publicKey string) (embedbus.Identity, bool) {
	if id, ok := d.static[publicKey]; ok {
		return id, true
	}
	e, ok := d.reg.ByKey(publicKey)
	if !ok || !e.Derivation.Bus {
		return embedbus.Identity{}, false // a module that does not require the bus has no account
	}
	p := ModulePermissions(e.Derivation, publicKey)
	return embedbus.Identity{Name: "module:" + e.Module, Permissions: &p}, true
}

// ModulePermissions is the whole permission set the bus grants a module's connection: what
// its manifest derives, plus the bootstrap that lets a client holding only its seed learn
// which module it is (registry.BootstrapPermissions).
func ModulePermissions(d *manifest.Derivation, publicKey string) manifest.Permissions {
	return d.Permissions.Merge(registry.BootstrapPermissions(publicKey))
}

// authorityChanged reports whether a registration change alters what a module's
// connections may do, so they must be kicked to reconnect under the new authority.
func authorityChanged(old, new *registry.Entry) bool {
	if old == nil {
		return false
	}
	if new == nil || new.PublicKey != old.PublicKey {
		return true
	}
	return !reflect.DeepEqual(old.Derivation.Permissions, new.Derivation.Permissions)
}
