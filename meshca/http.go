package meshca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
)

// A node's HTTP address (its API, metrics and console) is plain on loopback, and beyond it
// HTTPS with the node's certificate from the mesh's CA: the console's session cookie and
// the operator's actions never cross a network in the clear. Clients trust the CA's
// certificate (ca.pem in every data dir).

// HTTPS reports whether a node serving HTTP on addr serves it over TLS: beyond loopback, an
// unspecified address (every interface) included.
func HTTPS(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && !Loopback(host)
}

// HTTPURL is the URL a node's HTTP listener, configured as configured and bound at addr,
// answers at, https when secure. A configured name (node1.example) stays the URL's host: the
// node's certificate covers it as a name, not the address it resolved to. An unspecified
// host (0.0.0.0, ::) is given as 127.0.0.1: this machine reaches it there, and the
// certificate covers it.
func HTTPURL(configured string, addr net.Addr, secure bool) string {
	scheme := "http://"
	if secure {
		scheme = "https://"
	}
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return scheme + addr.String()
	}
	host := ta.IP.String()
	if h, _, err := net.SplitHostPort(configured); err == nil && h != "" && net.ParseIP(h) == nil {
		host = h
	} else if ta.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return scheme + net.JoinHostPort(host, strconv.Itoa(ta.Port))
}

// ErrNoCertificate refuses a TLS handshake before the node has its certificate: it is still
// starting (a joining node has its mesh's CA only once it joined).
var ErrNoCertificate = errors.New("the node has no certificate yet: it is still starting")

// Later is a Keeper that comes after the listener it serves: the node binds its HTTP address
// first, and has its certificate once it knows its mesh.
type Later struct{ k atomic.Pointer[Keeper] }

// Set makes k's certificate the one presented from the next handshake on.
func (l *Later) Set(k *Keeper) { l.k.Store(k) }

// ServerTLS is the configuration of an HTTPS listener: the keeper's current certificate at
// each handshake, and ErrNoCertificate until there is a keeper.
func (l *Later) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			k := l.k.Load()
			if k == nil {
				return nil, ErrNoCertificate
			}
			return k.cert.Load(), nil
		},
	}
}

// HTTPClient is an HTTP client of a node's HTTP address that trusts the mesh's CA in pool
// (and only it, for https); nil pool: http.DefaultClient, for a node on loopback.
func HTTPClient(pool *x509.CertPool) *http.Client {
	if pool == nil {
		return http.DefaultClient
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: t}
}
