//go:build integration

package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/meshca"
)

// TestIntegration_Binary_TLSClientPort: with client-tls always, the CLI reaches the node's TLS client port
// by its data dir (which holds ca.pem), and by URL only with --ca naming the mesh's CA —
// without it the refusal says what to do; `cert rotate` renews the certificate of the running
// node, which goes on serving.
func TestIntegration_Binary_TLSClientPort(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", append(upArgs(dir, "alpha"), "--client-tls", "always")...)
	defer p.stop(t, syscall.SIGTERM)
	if !strings.HasPrefix(p.clientURL, "tls://") {
		t.Fatalf("the node's client URL %s, want tls://", p.clientURL)
	}
	op, ca := filepath.Join(dir, "operator.nk"), filepath.Join(dir, "ca.pem")
	if r := meshnode(t, nil, "module", "ls", "--data-dir", dir); r.code != 0 {
		t.Fatalf("module ls by data dir over TLS: exit %d %s", r.code, r.stderr)
	}
	// By URL from elsewhere: the CA must be named.
	elsewhere := []string{"XDG_CONFIG_HOME=" + t.TempDir()}
	away := t.TempDir()
	t.Chdir(away)
	r := meshnode(t, elsewhere, "module", "ls", "--server", p.clientURL, "--creds", op)
	if r.code == 0 || !strings.Contains(r.stderr, "--ca") {
		t.Fatalf("module ls over TLS without the CA: exit %d %s, want a refusal naming --ca", r.code, r.stderr)
	}
	if r := meshnode(t, elsewhere, "module", "ls", "--server", p.clientURL, "--creds", op, "--ca", ca); r.code != 0 {
		t.Fatalf("module ls with --ca: exit %d %s", r.code, r.stderr)
	}
	other := filepath.Join(away, "other.pem")
	if err := os.WriteFile(other, otherCA(t), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := meshnode(t, elsewhere, "module", "ls", "--server", p.clientURL, "--creds", op, "--ca", other); r.code == 0 {
		t.Fatalf("module ls trusting another CA: exit 0 %s", r.stdout)
	}

	before, _ := os.ReadFile(filepath.Join(dir, meshca.CertFile))
	r = meshnode(t, nil, "cert", "rotate", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "node alpha has a new certificate") {
		t.Fatalf("cert rotate: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	after, _ := os.ReadFile(filepath.Join(dir, meshca.CertFile))
	if len(after) == 0 || string(after) == string(before) {
		t.Fatal("cert rotate left the node's certificate file as it was")
	}
	if r := meshnode(t, elsewhere, "module", "ls", "--server", p.clientURL, "--creds", op, "--ca", ca); r.code != 0 {
		t.Fatalf("module ls with --ca after the rotation: exit %d %s", r.code, r.stderr)
	}
}

// otherCA is the PEM certificate of a fresh self-signed CA: not the mesh's.
func otherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
