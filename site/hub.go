package site

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/membership"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/registry"
	"github.com/nats-io/nkeys"
)

// The hub's side of sites, which a server of the mesh uses: what it grants a site's link, how
// it records a site that enrols, and the URL sites reach it at.

// Hub is a server's side of sites.
type Hub struct {
	Config   config.Config // its leaf-addr, advertise and client-tls
	MeshID   string
	Registry *registry.Registry
	// Members are the mesh's servers as gossip knows them (nil for a single node): a site is
	// told every live one's leafnode URL.
	Members func() []membership.Member
	// CA is the mesh's CA certificate (DER), and TLS the leafnode port's TLS: both nil when
	// the mesh has no CA yet.
	CA  []byte
	TLS func() *tls.Config
	// Enrolled, if set, is called once a site is recorded: the node makes EVENTS source the
	// site's events.
	Enrolled func(ctx context.Context) error
}

// tlsOn reports whether the hub's leafnode port is TLS: beyond loopback, or when the client
// port's TLS is always on.
func (h Hub) tlsOn() bool {
	host, _, err := net.SplitHostPort(h.Config.LeafAddr)
	return h.TLS != nil && (h.Config.ClientTLS == "always" || (err == nil && !meshca.Loopback(host)))
}

// Listen is where the server takes sites' links while its clients are on clientAddr: nil when
// it takes none (no leaf-addr), or while it grows with clients on a loopback port of its own.
func (h Hub) Listen(clientAddr string) *embedbus.LeafListen {
	if h.Config.LeafAddr == "" || clientAddr != h.Config.ClientAddr {
		return nil
	}
	l := &embedbus.LeafListen{Addr: h.Config.LeafAddr}
	if h.tlsOn() {
		l.TLS = h.TLS()
	}
	return l
}

// URL is where sites reach the server ("" when it takes none, or cannot tell them where:
// a leaf-addr on every interface without advertise).
func (h Hub) URL() string {
	if h.Config.LeafAddr == "" {
		return ""
	}
	u, _ := LeafURL(h.Config.LeafAddr, h.Config.Advertise, h.tlsOn())
	return u
}

// Enrol records a site enrolling with a join token (vault.Config.EnrolSite) and returns what
// it needs: the mesh's id and CA, and every live server's leafnode URL, this one's first.
func (h Hub) Enrol(ctx context.Context, name, key string) (api.Enrolment, error) {
	if h.Config.LeafAddr == "" {
		return api.Enrolment{}, fmt.Errorf("this server takes no sites: set leaf-addr on the mesh's servers (e.g. --leaf-addr 0.0.0.0:7422 --advertise 10.0.0.2), then join the site again")
	}
	own, err := LeafURL(h.Config.LeafAddr, h.Config.Advertise, h.tlsOn())
	if err != nil {
		return api.Enrolment{}, fmt.Errorf("this server cannot tell a site where to link: %w; then join the site again", err)
	}
	if err := Enrol(ctx, h.Registry, name, key); err != nil {
		return api.Enrolment{}, err
	}
	if h.Enrolled != nil {
		if err := h.Enrolled(ctx); err != nil {
			return api.Enrolment{}, fmt.Errorf("site %s is recorded, but EVENTS does not source its events yet (%w): join it again with the same data dir and a new token", name, err)
		}
	}
	e := api.Enrolment{MeshID: h.MeshID, CA: h.CA, Leaf: []string{own}}
	for _, m := range h.Members() {
		if m.State == "alive" && m.Leaf != "" && m.Leaf != own {
			e.Leaf = append(e.Leaf, m.Leaf)
		}
	}
	return e, nil
}

// LinkIdentity is how a hub server admits the link of site: as a leafnode connection only,
// never as a client, with the permissions manifest.SiteLink derives (the site's mirror of the
// registry, the hub's sourcing of its events, its modules' calls of seats' tools and the
// answers to their inboxes — those of the modules reg holds now: Relink makes the link
// authenticate again when they change), and never an event's subject.
func LinkIdentity(site string, reg *registry.Registry) embedbus.Identity {
	var modules []string
	for _, e := range reg.List() {
		if e.Derivation.Bus {
			modules = append(modules, e.Module)
		}
	}
	p := manifest.SiteLink(site, modules, "KV_"+registry.Bucket)
	return embedbus.Identity{Name: "site:" + site, Leaf: true, Permissions: &p,
		PublishDeny: manifest.SiteDenied(), SubscribeDeny: manifest.SiteDenied()}
}

// Relink cuts every site's link to bus, when a module was registered or removed (old or new
// is nil): each site links again at once, and is granted the inboxes of the modules
// registered now.
func Relink(bus *embedbus.Bus, reg *registry.Registry, old, new *registry.Entry) int {
	if (old == nil) == (new == nil) || bus == nil {
		return 0
	}
	n := 0
	for _, name := range reg.Sites() {
		if id, ok := reg.Site(name); ok {
			n += bus.BarSite(id.PublicKey, name, time.Time{})
		}
	}
	return n
}

// Enrol records site, whose link authenticates with key, in the mesh's registry. A name that
// is a server's, or another site's under another key, is refused; the same site enrolling
// again with its own key is recorded again.
func Enrol(ctx context.Context, reg *registry.Registry, site, key string) error {
	if !nkeys.IsValidPublicUserKey(key) {
		return fmt.Errorf("site %s's key %.40q is not an nkey user public key", site, key)
	}
	if _, ok := reg.Node(site); ok {
		return fmt.Errorf("mesh has a server named %s: join the site under another --name", site)
	}
	if id, ok := reg.Site(site); ok && id.PublicKey != key {
		return fmt.Errorf("mesh has a site named %s already (enrolled %s, with another key): join under another --name", site, id.Enrolled.Format(time.RFC3339))
	}
	if other, ok := reg.SiteByKey(key); ok && other != site {
		return fmt.Errorf("site %s has this key already: a site's key is its own", other)
	}
	return reg.SetSite(ctx, site, registry.SiteIdentity{PublicKey: key, Enrolled: time.Now().UTC()})
}

// LeafURL is where sites reach a hub server whose leafnode port is leafAddr: with advertise's
// host when set (a port bound on every interface needs it), tls:// when the port is TLS.
func LeafURL(leafAddr, advertise string, tlsOn bool) (string, error) {
	host, port, err := net.SplitHostPort(leafAddr)
	if err != nil {
		return "", fmt.Errorf("leaf-addr %q: %w", leafAddr, err)
	}
	if advertise != "" {
		host = advertise
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return "", fmt.Errorf("leaf-addr %s binds every interface, and sites must be told which address reaches this server: set --advertise to it", leafAddr)
	}
	scheme := "nats-leaf://"
	if tlsOn {
		scheme = "tls://"
	}
	return scheme + net.JoinHostPort(host, port), nil
}
