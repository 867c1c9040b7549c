package node

import (
	"strings"
	"testing"

	"github.com/meshnode/meshnode/config"
)

// TestAdvertised: a node advertises its bound addresses, or --advertise's host with their
// ports; every interface, or loopback to peers elsewhere, is refused with the fix.
func TestAdvertised(t *testing.T) {
	t.Parallel()
	cfg := config.Config{ClusterAddr: "127.0.0.1:6222", ClientAddr: "127.0.0.1:4222", GossipAddr: "127.0.0.1:7946"}
	a, err := advertised(cfg, []string{"127.0.0.1:7947"})
	if err != nil || a.route != "127.0.0.1:6222" || a.client != "127.0.0.1:4222" {
		t.Fatalf("loopback among loopback: %+v %v", a, err)
	}
	if _, err := advertised(cfg, []string{"10.0.0.1:7946"}); err == nil || !strings.Contains(err.Error(), "peers that are elsewhere (10.0.0.1:7946)") {
		t.Fatalf("loopback to a peer elsewhere: %v", err)
	}
	cfg.ClusterAddr, cfg.ClientAddr, cfg.GossipAddr = "0.0.0.0:6222", "[::]:4222", "0.0.0.0:7946"
	if _, err := advertised(cfg, nil); err == nil || !strings.Contains(err.Error(), "--advertise") {
		t.Fatalf("every interface: %v", err)
	}
	cfg.Advertise = "10.0.0.2"
	a, err = advertised(cfg, []string{"10.0.0.1:7946"})
	if err != nil || a.route != "10.0.0.2:6222" || a.client != "10.0.0.2:4222" || a.gossip != "10.0.0.2:7946" {
		t.Fatalf("--advertise: %+v %v", a, err)
	}
}
