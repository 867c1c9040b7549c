package meshca_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/meshca"
	"github.com/nats-io/nats.go"
)

func mustCA(t *testing.T, barrier, mesh string) *meshca.CA {
	t.Helper()
	ca, err := meshca.New([]byte(barrier), mesh)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestCA_EveryServerDerivesTheSame: a certificate issued by one server's CA verifies
// against another server's, derived from the same barrier key; not against another mesh's.
func TestCA_EveryServerDerivesTheSame(t *testing.T) {
	a, b := mustCA(t, "route-secret-32-bytes-long-.....,", "m1"), mustCA(t, "route-secret-32-bytes-long-.....,", "m1")
	other := mustCA(t, "another-route-secret-32-bytes...", "m1")
	cert, err := a.Issue("alpha", meshca.Hosts("10.0.0.2:6222"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"alpha", "10.0.0.2", "127.0.0.1", "localhost"} {
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: b.Pool(), DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("verify for %s against the same mesh's CA: %v", host, err)
		}
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: other.Pool()}); err == nil {
		t.Error("a certificate verified against another mesh's CA")
	}
	if meshca.Due(cert, meshca.Hosts("10.0.0.2:6222"), time.Now()) {
		t.Error("a fresh certificate is due")
	}
	if !meshca.Due(cert, meshca.Hosts("10.0.0.3:6222"), time.Now()) || !meshca.Due(cert, nil, time.Now().Add(70*24*time.Hour)) {
		t.Error("a certificate for other hosts, or two thirds through its life, is not due")
	}
}

// TestKeeper_RouteTLS: two servers' route configurations complete a handshake, each
// verifying the other; a server of another mesh is refused; a renewed certificate is the one
// presented at the next handshake.
func TestKeeper_RouteTLS(t *testing.T) {
	ca := mustCA(t, "route-secret-32-bytes-long-.....,", "m1")
	keeper := func(ca *meshca.CA, name string) *meshca.Keeper {
		c, err := ca.Issue(name, meshca.Hosts(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return meshca.NewKeeper(ca, c)
	}
	a, b := keeper(ca, "a"), keeper(ca, "b")
	handshake := func(server, client *meshca.Keeper) (*x509.Certificate, error) {
		c1, c2 := net.Pipe()
		defer c1.Close()
		defer c2.Close()
		cfg := client.RouteTLS()
		cfg.ServerName = "127.0.0.1"
		srv := tls.Server(c1, server.RouteTLS())
		errs := make(chan error, 1)
		go func() { errs <- srv.Handshake() }()
		cl := tls.Client(c2, cfg)
		err := cl.Handshake()
		if serr := <-errs; err == nil {
			err = serr
		}
		if err != nil {
			return nil, err
		}
		return cl.ConnectionState().PeerCertificates[0], nil
	}
	first, err := handshake(a, b)
	if err != nil || first.Subject.CommonName != "a" {
		t.Fatalf("handshake of two servers of the mesh: %v", err)
	}
	if _, err := handshake(a, keeper(mustCA(t, "another-route-secret-32-bytes...", "m1"), "x")); err == nil {
		t.Fatal("a server of another mesh completed a route handshake")
	}
	renewed, _ := ca.Issue("a", meshca.Hosts(), time.Now())
	a.Set(renewed)
	second, err := handshake(a, b)
	if err != nil || second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatalf("after a renewal the old certificate is presented (%v)", err)
	}
}

// TestSave_Load: the certificate and key written to a data dir read back; the CA's
// certificate there is a pool clients can use.
func TestSave_Load(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, "route-secret-32-bytes-long-.....,", "m1")
	if got, err := meshca.Load(dir); got != nil || err != nil {
		t.Fatalf("load from an empty dir: %v %v", got, err)
	}
	cert, _ := ca.Issue("a", meshca.Hosts(), time.Now())
	if err := meshca.Save(dir, ca, cert); err != nil {
		t.Fatal(err)
	}
	got, err := meshca.Load(dir)
	if err != nil || got == nil || got.Leaf == nil || got.Leaf.SerialNumber.Cmp(cert.Leaf.SerialNumber) != 0 {
		t.Fatalf("load: %v %v", got, err)
	}
	pool, err := meshca.RootCAs(dir + "/" + meshca.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := got.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "a"}); err != nil {
		t.Fatalf("verify against the saved CA: %v", err)
	}
}

// TestClientOptions: a client of a node off loopback requires TLS (a plain answer would be
// someone in between); of a node on loopback it verifies TLS when offered.
func TestClientOptions(t *testing.T) {
	ca := mustCA(t, "route-secret-32-bytes-long-.....,", "m1")
	for url, secure := range map[string]bool{
		"nats://10.0.0.2:4222":                          true,
		"nats://node-b.example:4222":                    true,
		"nats://127.0.0.1:4222":                         false,
		"nats://localhost:4222":                         false,
		"nats://[::1]:4222, nats://127.0.0.1:4223":      false,
		"nats://127.0.0.1:4222,nats://192.168.1.9:4222": true,
	} {
		o := nats.GetDefaultOptions()
		o.Servers = strings.Split(strings.ReplaceAll(url, " ", ""), ",")
		meshca.ClientOptions(&o, ca.Pool())
		if o.Secure != secure || o.TLSConfig == nil || o.TLSConfig.RootCAs == nil {
			t.Errorf("%s: secure %v (want %v), TLS config %v", url, o.Secure, secure, o.TLSConfig)
		}
	}
}
