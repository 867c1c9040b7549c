package meshca

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"

	"github.com/nats-io/nats.go"
)

// ClientOptions makes a nats client verify a TLS client port against pool, and require
// TLS of every server it is given off loopback: nats.go upgrades to TLS only when the
// server's INFO asks for it, so a plain INFO from someone in between would otherwise strip
// it. A server on loopback may stay plain (client-tls auto).
func ClientOptions(o *nats.Options, pool *x509.CertPool) {
	o.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	servers := o.Servers
	if o.Url != "" {
		servers = append(servers, o.Url)
	}
	for _, s := range servers {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if !Loopback(u.Hostname()) {
			o.Secure = true
		}
	}
}

// Loopback reports whether host (a name or an IP address, no port) is localhost or a
// loopback address: reachable from this machine only.
func Loopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}
