//go:build integration

package node_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/meshca"
)

// TestIntegration_TLS_Routes: a formed mesh's route port speaks TLS only, verifying the other end: a
// server with another server's certificate gets through the handshake to the route
// protocol; one with a certificate of another mesh's CA, or none, is refused.
func TestIntegration_TLS_Routes(t *testing.T) {
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
