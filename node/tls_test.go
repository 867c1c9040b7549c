package node_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
)

// TestTLS_ClientPort: with client-tls always, the client port is TLS with the node's
// certificate: a module trusting the data dir's ca.pem connects, one trusting nothing is
// refused; `cert rotate` gives the node a new certificate, presented to the next
// connection, with the old connections kept.
func TestTLS_ClientPort(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.ClientTLS = "always"
	n := MustOpenNode(t, cfg)
	ca := filepath.Join(cfg.DataDir, meshca.CAFile)
	op, err := nats.Connect(n.ClientURL(), sdk.TrustCA(ca), nkeyOption(t, filepath.Join(cfg.DataDir, datadir.OperatorSeedFile)), nats.CustomInboxPrefix(manifest.OperatorInbox))
	if err != nil {
		t.Fatalf("the operator over TLS: %v", err)
	}
	defer op.Close()
	before := peerCert(t, n.ClientURL(), ca)

	if _, err := nats.Connect(n.ClientURL(), nkeyOption(t, filepath.Join(cfg.DataDir, datadir.OperatorSeedFile)), nats.MaxReconnects(0)); err == nil {
		t.Fatal("a client that trusts no CA connected to the TLS port")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, err := op.RequestWithContext(ctx, manifest.NodeToolSubject("alpha", api.NodeToolCertRotate), nil)
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

func msgData(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}
