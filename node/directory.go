package node

import (
	"reflect"
	"slices"
	"sync/atomic"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/site"
	"github.com/meshnode/meshnode/vault"
)

// directory tells the bus who a key is: the node itself and the operator administer; a
// registered module gets what its manifest derives, and nothing else.
type directory struct {
	node     string // this node's name
	static   map[string]embedbus.Identity
	reg      *registry.Registry
	operator atomic.Value                // string: the operator's key, "" until genesis hands off
	vaultKey atomic.Value                // string: the vault's bus identity, once this node has it
	seats    atomic.Pointer[seatService] // nil until the seats are open: nobody holds anything yet
	vault    atomic.Pointer[vault.Vault] // nil until the vault is open: no join tokens yet
	// complete is closed once the directory knows every key it will admit (the registry, the
	// vault's tokens and the seats are read): until then the bus holds an unknown key's
	// connect instead of refusing it (embedbus.Config.Complete).
	complete chan struct{}
}

var _ embedbus.Directory = (*directory)(nil)

func (d *directory) Identity(publicKey, name string) (embedbus.Identity, bool) {
	if id, ok := d.static[publicKey]; ok {
		return id, true
	}
	if vk, _ := d.vaultKey.Load().(string); vk != "" && vk == publicKey {
		p := vaultPermissions(d.node)
		return embedbus.Identity{Name: "vault", Permissions: &p}, true
	}
	if op, _ := d.operator.Load().(string); op != "" && op == publicKey {
		return embedbus.Identity{Name: "operator", System: true}, true
	}
	if op := d.reg.Operator(); op != "" && op == publicKey {
		return embedbus.Identity{Name: "operator", System: true}, true // admitted on every node of the mesh
	}
	if v := d.vault.Load(); v != nil {
		if id, ok := v.TokenID(publicKey); ok {
			p := tokenPermissions(id, publicKey)
			return embedbus.Identity{Name: "token:" + id, Permissions: &p}, true
		}
	}
	if s, ok := d.reg.SiteByKey(publicKey); ok {
		return site.LinkIdentity(s, d.reg), true // a site's link, admitted as a leafnode only
	}
	e, ok := d.reg.ByKey(publicKey)
	if !ok || !e.Derivation.Bus {
		return embedbus.Identity{}, false // a module that does not require the bus has no account
	}
	p := ModulePermissions(e.Derivation, publicKey)
	if s := d.seats.Load(); s != nil {
		for _, l := range s.grants(e.Module, name) {
			if hp, err := e.Derivation.HolderGrant(l.Seat, l.Node, seatCallers(d.reg, l.Seat)); err == nil {
				p = p.Merge(hp)
			}
		}
	}
	return embedbus.Identity{Name: moduleUser(e.Module), Permissions: &p}, true
}

// seatCallers are the registered modules that use seat: whom its holder answers.
func seatCallers(reg *registry.Registry, seat string) []string {
	var out []string
	for _, e := range reg.List() {
		if slices.Contains(e.Manifest.Uses, seat) {
			out = append(out, e.Module)
		}
	}
	return out
}

// seatsWithNewCallers are the seats serving tools whose callers a registration change
// adds or removes: their holders' grants name the callers' inboxes.
func seatsWithNewCallers(reg *registry.Registry, old, new *registry.Entry) []string {
	uses := func(e *registry.Entry) []string {
		if e == nil {
			return nil
		}
		return e.Manifest.Uses
	}
	var out []string
	for _, seat := range symmetricDifference(uses(old), uses(new)) {
		if info := reg.Seat(seat); len(info.Serves) > 0 {
			out = append(out, seat)
		}
	}
	return out
}

func symmetricDifference(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	for _, s := range b {
		if !slices.Contains(a, s) {
			out = append(out, s)
		}
	}
	return out
}

// moduleUser is how a module's connections are named in the server (its "user").
func moduleUser(module string) string { return "module:" + module }

// ModulePermissions is the whole permission set the bus grants every connection of a module:
// manifest.Derivation.Grant. The instance holding a seat's lease gets the seat's holder
// permissions on top.
func ModulePermissions(d *manifest.Derivation, publicKey string) manifest.Permissions {
	return d.Grant(publicKey)
}

// tokenPermissions are a join token's: request enrol with it, hear the answer — nothing else.
func tokenPermissions(id, publicKey string) manifest.Permissions {
	return manifest.Permissions{
		Publish:   []string{api.VaultToolSubject(api.VaultVerbEnrol, id)},
		Subscribe: []manifest.Subscription{{Subject: api.BootstrapInbox(publicKey) + ".>"}},
	}
}

// SeatToolSubject is manifest.NodeSeatToolSubject: where a module's instance asks node about
// its seats; only that module may publish there.
func SeatToolSubject(node, module string) string { return manifest.NodeSeatToolSubject(node, module) }

// authorityChanged reports whether a registration change alters what a module's
// connections may do — its whole grant (declarations, secrets, seats) or what holding one of
// its seats adds — so they must be kicked to reconnect under the new authority.
func authorityChanged(old, new *registry.Entry) bool {
	if old == nil {
		return false
	}
	if new == nil || new.PublicKey != old.PublicKey {
		return true
	}
	if !reflect.DeepEqual(old.Derivation.Grant(old.PublicKey), new.Derivation.Grant(new.PublicKey)) {
		return true
	}
	holders := func(d *manifest.Derivation) map[string]manifest.Permissions {
		out := map[string]manifest.Permissions{}
		for _, s := range d.Seats {
			out[s.Name] = s.Holder
		}
		return out
	}
	return !reflect.DeepEqual(holders(old.Derivation), holders(new.Derivation))
}

// moduleOf is the registered module whose key is key: how the bus's log names the module
// behind a permission violation (embedbus.Config.ModuleOf).
func (n *Node) moduleOf(key string) (string, bool) {
	if e, ok := n.reg.ByKey(key); ok {
		return e.Module, true
	}
	return "", false
}
