package embedbus

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// A link's pings: nats-server pings a leafnode connection at the server's PingInterval (2 min
// by default, two unanswered allowed), so a link cut without a close (a cable, a NAT that
// forgot it) would stay up in both servers' view for up to 6 minutes; a site would not look
// for another hub server meanwhile. A server with a leafnode port or link pings every
// connection as routes are pinged: a cut link is dropped, and the site moves, within 15–20 s.
const (
	linkPingInterval = routePingInterval
	linkMaxPingsOut  = routeMaxPingsOut
)

// leafOptions sets a hub's leafnode port and a site's link to its hub on opts.
func leafOptions(opts *server.Options, listen *LeafListen, hub *Hub) error {
	if listen != nil || hub != nil {
		opts.PingInterval, opts.MaxPingsOut = linkPingInterval, linkMaxPingsOut
	}
	if l := listen; l != nil {
		host, port, err := splitAddr(l.Addr)
		if err != nil {
			return fmt.Errorf("leafnode address %q: %w", l.Addr, err)
		}
		if err := probeListen(l.Addr); err != nil {
			return err
		}
		// No user, nkey or users of its own: nats-server then asks the
		// CustomClientAuthentication, which admits a site's node key as a leafnode.
		opts.LeafNode.Host, opts.LeafNode.Port, opts.LeafNode.Advertise = host, port, l.Advertise
		if l.TLS != nil {
			opts.LeafNode.TLSConfig, opts.LeafNode.TLSTimeout = l.TLS, tlsTimeout.Seconds()
		}
	}
	if h := hub; h != nil {
		if len(h.URLs) == 0 || len(h.Seed) == 0 {
			return errors.New("a site needs its hub's leafnode URLs and its node's seed")
		}
		remote := &server.RemoteLeafOpts{
			Nkey:        string(h.Seed),
			DenyExports: append([]string{}, h.Deny...),
			DenyImports: append([]string{}, h.Deny...),
		}
		for _, raw := range h.URLs {
			u, err := url.Parse(raw)
			if err != nil || u.Host == "" {
				return fmt.Errorf("hub leafnode URL %q: want nats-leaf://host:port or tls://host:port", raw)
			}
			remote.URLs = append(remote.URLs, u)
		}
		if h.TLS != nil {
			remote.TLS, remote.TLSConfig, remote.TLSTimeout = true, h.TLS, tlsTimeout.Seconds()
		}
		opts.LeafNode.Remotes = []*server.RemoteLeafOpts{remote}
	}
	return nil
}

// Linked reports whether the server has a leafnode connection up: a site's to its hub, or
// any site's to a hub.
func (b *Bus) Linked() bool { return b.srv.NumLeafNodes() > 0 }

// Sites are the names of the sites linked to this server now (their connections' names are
// their servers').
func (b *Bus) Sites() []string {
	lz, err := b.srv.Leafz(nil)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range lz.Leafs {
		out = append(out, l.Name)
	}
	return out
}

// BarSite cuts the link of the site named name, whose node key is publicKey, and refuses it
// until until (a time already past lifts the bar at the site's next try); it returns how
// many links it cut. The site goes on storing its modules' events meanwhile.
func (b *Bus) BarSite(publicKey, name string, until time.Time) int {
	b.auth.bars.set(publicKey, until)
	lz, err := b.srv.Leafz(nil)
	if err != nil {
		return 0
	}
	n := 0
	for _, l := range lz.Leafs {
		if l.Name == name && b.srv.DisconnectClientByID(l.ID) == nil {
			n++
		}
	}
	return n
}
