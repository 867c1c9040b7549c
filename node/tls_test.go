package node_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
)

// TestTLS_Routes: a formed mesh's route port speaks TLS only, verifying the other end: a
// server with another server's certificate gets through the handshake to the route
// protocol; one with a certificate of another mesh's CA, or none, is refused.
func TestTLS_Routes(t *testing.T) {
	cfgs, nodes := openThree(t)
	for _, n := range nodes {
		defer n.Close()
	}
	b, err := meshca.Load(cfgs[1].DataDir)
	if err != nil || b == nil {
		t.Fatalf("b's certificate: %v", err)
	}
	if err := routeHandshake(t, cfgs[0], b); err != nil {
		t.Fatalf("a server of the mesh: %v", err)
	}
	stranger, err := meshca.New([]byte("another mesh's route credential"), "m2")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := stranger.Issue("x", meshca.Hosts(), time.Now())
	if err := routeHandshake(t, cfgs[0], &other); err == nil {
		t.Fatal("a server of another mesh got through the route handshake")
	}
	if err := routeHandshake(t, cfgs[0], nil); err == nil {
		t.Fatal("a client without a certificate got through the route handshake")
	}
	conn, err := net.DialTimeout("tcp", cfgs[0].ClusterAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A plain client sees no NATS protocol in the clear: no INFO, no answer to a PING.
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	conn.Write([]byte("CONNECT {}\r\nPING\r\n"))
	clear, _ := io.ReadAll(conn)
	if strings.Contains(string(clear), "INFO") || strings.Contains(string(clear), "PONG") {
		t.Fatalf("the route port spoke in the clear: %q", clear)
	}
}

// routeHandshake opens a TLS connection to cfg's route port with cert (nil: none),
// verifying the server against the mesh's CA, and reads the route protocol's first line.
func routeHandshake(t *testing.T, cfg config.Config, cert *tls.Certificate) error {
	t.Helper()
	pool, err := meshca.RootCAs(filepath.Join(cfg.DataDir, meshca.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.DialTimeout("tcp", cfg.ClusterAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(5 * time.Second))
	host, _, _ := net.SplitHostPort(cfg.ClusterAddr)
	tc := &tls.Config{RootCAs: pool, ServerName: host}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	c := tls.Client(raw, tc)
	if err := c.Handshake(); err != nil {
		return err
	}
	// TLS 1.3 tells a refused client certificate on the first read.
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && !strings.HasPrefix(line, "INFO ") {
		return errors.New("no INFO: " + line)
	}
	return err
}

// TestTLS_ClientPort: with client-tls always, the client port is TLS with the node's
// certificate: a module trusting the data dir's ca.pem connects, one trusting nothing is
// refused; `cert rotate` gives the node a new certificate, presented to the next
// connection, with the old connections kept.
func TestTLS_ClientPort(t *testing.T) {
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.ClientTLS = "always"
	n := MustOpenNode(t, cfg)
	ca := filepath.Join(cfg.DataDir, meshca.CAFile)
	op, err := nats.Connect(n.ClientURL(), sdk.TrustCA(ca), nkeyOption(t, filepath.Join(cfg.DataDir, node.OperatorSeedFile)), nats.CustomInboxPrefix(manifest.OperatorInbox))
	if err != nil {
		t.Fatalf("the operator over TLS: %v", err)
	}
	defer op.Close()
	before := peerCert(t, n.ClientURL(), ca)

	if _, err := nats.Connect(n.ClientURL(), nkeyOption(t, filepath.Join(cfg.DataDir, node.OperatorSeedFile)), nats.MaxReconnects(0)); err == nil {
		t.Fatal("a client that trusts no CA connected to the TLS port")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, err := op.RequestWithContext(ctx, manifest.NodeToolSubject("alpha", node.ToolCertRotate), nil)
	if err != nil || !strings.Contains(string(msg.Data), `"ok":true`) {
		t.Fatalf("cert rotate: %v %s", err, msgData(msg))
	}
	after := peerCert(t, n.ClientURL(), ca)
	if after.SerialNumber.Cmp(before.SerialNumber) == 0 {
		t.Fatal("after cert rotate the node presents the same certificate")
	}
	if !op.IsConnected() {
		t.Fatal("the connection from before the rotation dropped")
	}
	saved, err := meshca.Load(cfg.DataDir)
	if err != nil || saved.Leaf.SerialNumber.Cmp(after.SerialNumber) != 0 {
		t.Fatalf("the data dir holds another certificate than the one presented: %v", err)
	}
}

// peerCert is the certificate the TLS client port at url presents, verified against ca.
func peerCert(t *testing.T, u, ca string) *x509.Certificate {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.DialTimeout("tcp", pu.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(raw).ReadString('\n'); err != nil { // INFO first
		t.Fatal(err)
	}
	pool, err := meshca.RootCAs(ca)
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: pu.Hostname()})
	if err := c.Handshake(); err != nil {
		t.Fatalf("TLS to the client port, verified against the mesh's CA: %v", err)
	}
	return c.ConnectionState().PeerCertificates[0]
}

// nkeyOption authenticates with the seed in file.
func nkeyOption(t *testing.T, file string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(file)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
