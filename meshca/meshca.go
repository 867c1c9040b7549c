package meshca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"
)

// The CA's key is derived from the mesh's route credential, which every server holds from
// the moment it has a foundation (genesis, the founding token, enrolment) and which already
// admits a server to the routes: so every server issues its own certificate at genesis,
// formation and enrolment without asking anyone over a route that needs the certificate
// first, and nothing more has to be kept or handed over. The CA adds no one to the servers'
// circle of trust; it adds encryption and verification to what the credential admits.

// Validity is how long a server's certificate is valid; it is renewed when a third of that
// is left (at start, or with `meshnode cert rotate`).
const Validity = 90 * 24 * time.Hour

// ErrNotPEM means a file holds no PEM certificate.
var ErrNotPEM = errors.New("no PEM certificate")

// CA is the mesh's certificate authority.
type CA struct {
	Cert *x509.Certificate
	PEM  []byte // the certificate: what clients trust
	key  *ecdsa.PrivateKey
}

// New derives the mesh's CA from its route credential: an ECDSA P-256 key (HKDF-SHA256)
// and a self-signed certificate named after the mesh. Every server derives the same key and
// subject; the signature differs, which verification does not mind.
func New(routeSecret []byte, meshID string) (*CA, error) {
	if len(routeSecret) == 0 {
		return nil, errors.New("meshca: no route credential")
	}
	var key *ecdsa.PrivateKey
	for i := byte(0); key == nil; i++ {
		d, err := hkdf.Key(sha256.New, routeSecret, []byte(meshID), "meshnode mesh CA "+string('0'+i), 32)
		if err != nil {
			return nil, err
		}
		key, _ = ecdsa.ParseRawPrivateKey(elliptic.P256(), d) // out of range: the next one
		if key == nil && i == 9 {
			return nil, errors.New("meshca: no key in range")
		}
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "meshnode mesh " + meshID + " CA", Organization: []string{"meshnode"}},
		NotBefore:             time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2120, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}, nil
}

// Pool is a pool holding the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue makes a certificate for server node, valid for its name and hosts (IP addresses or
// DNS names), for both ends of a TLS connection (routes are dialled by both sides).
func (ca *CA) Issue(node string, hosts []string, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: node, Organization: []string{"meshnode"}},
		NotBefore:    now.Add(-time.Hour), // clocks differ a little
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{node},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(tmpl.IPAddresses, ip.Equal) {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else if h != "" && !slices.Contains(tmpl.DNSNames, h) {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// Hosts are the names and addresses a server's certificate covers: loopback, and the hosts
// of its addresses (every interface is covered only by what it advertises).
func Hosts(addrs ...string) []string {
	out := []string{"localhost", "127.0.0.1", "::1"}
	for _, a := range addrs {
		h := a
		if host, _, err := net.SplitHostPort(a); err == nil {
			h = host
		}
		if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
			continue
		}
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// Keeper holds a server's certificate and swaps it when it is renewed: the TLS
// configurations it makes ask it for the certificate at each handshake, so a renewal takes
// effect without a restart and without dropping a connection.
type Keeper struct {
	ca   *CA
	cert atomic.Pointer[tls.Certificate]
}

// NewKeeper keeps cert, issued by ca.
func NewKeeper(ca *CA, cert tls.Certificate) *Keeper {
	k := &Keeper{ca: ca}
	k.cert.Store(&cert)
	return k
}

// Set makes cert the one presented from the next handshake on.
func (k *Keeper) Set(cert tls.Certificate) { k.cert.Store(&cert) }

// Current is the certificate presented now.
func (k *Keeper) Current() tls.Certificate { return *k.cert.Load() }

// RouteTLS is the configuration of routes: both ends present their certificate and verify
// the other's against the mesh's CA.
func (k *Keeper) RouteTLS() *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		GetCertificate:       func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return k.cert.Load(), nil },
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return k.cert.Load(), nil },
		RootCAs:              k.ca.Pool(),
		ClientCAs:            k.ca.Pool(),
		ClientAuth:           tls.RequireAndVerifyClientCert,
	}
}

// ClientTLS is the configuration of the client port: the server presents its certificate;
// clients prove who they are with their nkey, as without TLS.
func (k *Keeper) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return k.cert.Load(), nil },
	}
}

// Due reports whether cert should be renewed at now: a third of its validity left, or it
// does not cover hosts.
func Due(cert tls.Certificate, hosts []string, now time.Time) bool {
	leaf := cert.Leaf
	if leaf == nil || now.After(leaf.NotAfter.Add(-Validity/3)) {
		return true
	}
	for _, h := range hosts {
		if leaf.VerifyHostname(h) != nil {
			return true
		}
	}
	return false
}

// The files of a server's TLS material in its data dir: the CA's certificate (what clients
// on that machine trust), and the server's certificate and key.
const (
	CAFile   = "ca.pem"
	CertFile = "tls/node.pem"
	KeyFile  = "tls/node-key.pem"
)

// Load reads the server's certificate and key from dir, nil if there are none.
func Load(dir string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &cert, nil
}

// Save writes the CA's certificate and the server's certificate and key into dir.
func Save(dir string, ca *CA, cert tls.Certificate) error {
	if err := os.MkdirAll(filepath.Join(dir, "tls"), 0o700); err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return err
	}
	var certPEM bytes.Buffer
	for _, der := range cert.Certificate {
		pem.Encode(&certPEM, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600},
		{CertFile, certPEM.Bytes(), 0o644},
		{CAFile, ca.PEM, 0o644},
	} {
		if err := writeAtomic(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// PoolOf is a pool holding the CA certificate der (a join token's, a site's record's).
func PoolOf(der []byte) (*x509.CertPool, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	p.AddCert(cert)
	return p, nil
}

// RootCAs reads a CA certificate file (a data dir's ca.pem, or --ca) into a pool.
func RootCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: %w", path, ErrNotPEM)
	}
	return p, nil
}
