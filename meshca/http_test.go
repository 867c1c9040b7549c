package meshca_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/meshnode/meshnode/meshca"
)

// TestHTTPS: a node's HTTP address is HTTPS beyond loopback (every interface included) and
// plain on it; its URL names 127.0.0.1 for an unspecified host.
func TestHTTPS(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:8422": false, "localhost:8422": false, "[::1]:8422": false,
		"10.0.0.2:8422": true, "0.0.0.0:8422": true, ":8422": true, "[::]:8422": true} {
		if got := meshca.HTTPS(addr); got != want {
			t.Errorf("HTTPS(%q)=%v, want %v", addr, got, want)
		}
	}
	for _, tc := range []struct {
		configured string
		addr       *net.TCPAddr
		secure     bool
		want       string
	}{
		{"127.0.0.1:0", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8422}, false, "http://127.0.0.1:8422"},
		{"10.0.0.2:8422", &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 8422}, true, "https://10.0.0.2:8422"},
		{"0.0.0.0:8422", &net.TCPAddr{IP: net.IPv4zero, Port: 8422}, true, "https://127.0.0.1:8422"},
		{":8422", &net.TCPAddr{IP: net.IPv6unspecified, Port: 8422}, true, "https://127.0.0.1:8422"},
		{"node1.example:8422", &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 8422}, true, "https://node1.example:8422"}, // the name the certificate covers
		{"[::1]:0", &net.TCPAddr{IP: net.IPv6loopback, Port: 8422}, false, "http://[::1]:8422"},
	} {
		if got := meshca.HTTPURL(tc.configured, tc.addr, tc.secure); got != tc.want {
			t.Errorf("HTTPURL(%s, %s, %v)=%s, want %s", tc.configured, tc.addr, tc.secure, got, tc.want)
		}
	}
}

// TestLater_ServesHTTPS: a listener wrapped before the node has its certificate refuses
// handshakes (ErrNoCertificate) until the keeper is set, then presents the certificate; a
// client trusting the mesh's CA is answered, one that does not is refused.
func TestLater_ServesHTTPS(t *testing.T) {
	ca := mustCA(t, "route-secret-32-bytes-long-.....,", "m1")
	cert, err := ca.Issue("alpha", meshca.Hosts("127.0.0.1:8422"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var later meshca.Later
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })}
	go srv.Serve(tls.NewListener(ln, later.ServerTLS()))
	defer srv.Close()
	url := meshca.HTTPURL("127.0.0.1:0", ln.Addr(), true)
	client := meshca.HTTPClient(ca.Pool())
	client.Timeout = 5 * time.Second

	if _, err := client.Get(url); err == nil {
		t.Fatal("a handshake before the node has its certificate succeeded")
	}
	later.Set(meshca.NewKeeper(ca, cert))
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET trusting the mesh's CA: %v", err)
	}
	resp.Body.Close()
	var unknown x509.UnknownAuthorityError
	_, err = (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if !errors.As(err, &unknown) {
		t.Fatalf("GET without the mesh's CA: %v, want the certificate refused", err)
	}
	if meshca.HTTPClient(nil) != http.DefaultClient {
		t.Error("HTTPClient(nil) is not the default client")
	}
}
