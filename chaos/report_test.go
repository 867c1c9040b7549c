package chaos_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/chaos"
)

func TestReport_String(t *testing.T) {
	c := cleanRun()
	c.ok("a", "renew", "seat", "", 1, 5015, 5018) // a renews after b acquired: two holders
	rep := chaos.Check(c.ops, c.final, chaos.Bounds{LeaseTTL: 3 * time.Second})
	rep.Faults = map[string]int{"kill": 2, "pause": 1}
	s := rep.String()
	for _, want := range []string{
		"check lost       ok\n",
		"check leases     1 anomalies\n",
		"operations: 23 (acquire 2, deliver 4, deploy 1, effect 3, emit 2, handle 2, lose 1, release 1, renew 3, submit 2, vault-write 2), faults: 3 (kill 2, pause 1), anomalies: 1 (lease 1)\n",
		"anomaly leases/lease: seat seat: lease history not linearizable",
		"    #22 @5.015s a renew seat epoch 1 -> ok @5.018s\n", // the slice shows the renewal
		"    #11 @5s b acquire seat epoch 2 -> ok @5.01s\n",    // and the acquisition it overlaps
	} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}

func TestReport_VisualizeLeases(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.html")
	c := cleanRun()
	wrote, err := chaos.Check(c.ops, c.final, chaos.Bounds{}).VisualizeLeases(path)
	if err != nil || wrote {
		t.Fatalf("VisualizeLeases of a clean run = %v, %v; want nothing written", wrote, err)
	}
	c.ok("a", "renew", "seat", "", 1, 5500, 5510)
	wrote, err = chaos.Check(c.ops, c.final, chaos.Bounds{}).VisualizeLeases(path)
	if err != nil || !wrote {
		t.Fatalf("VisualizeLeases = %v, %v; want the rendering written", wrote, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "a renew seat epoch 1") {
		t.Errorf("visualization does not describe the lease operations (%d bytes)", len(b))
	}
}
