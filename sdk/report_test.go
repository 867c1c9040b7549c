package sdk

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// TestClient_ReportsWhileItServes: the reporter starts with the first tool a client serves
// (a client that serves none runs none), and reports the tool's calls while the client is
// open, not only at its close.
func TestClient_ReportsWhileItServes(t *testing.T) {
	was := reportEvery
	reportEvery = 20 * time.Millisecond
	t.Cleanup(func() { reportEvery = was })

	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	busKey, _ := nkeys.CreateUser()
	busPub, _ := busKey.PublicKey()
	srv := testbed.NATSServer(t, &server.Options{ServerName: "n", Nkeys: []*server.NkeyUser{{Nkey: pub}, {Nkey: busPub}}})
	bus, _ := testbed.Connect(t, srv, nats.Nkey(busPub, busKey.Sign))
	seedFile := filepath.Join(t.TempDir(), "desk.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	// The node's whoami, as a plain responder (the server checks no key here).
	self, _ := json.Marshal(api.WhoamiReply{Module: "desk", Node: "n", Tools: []string{"status"}})
	if _, err := bus.Subscribe(api.WhoamiSubject(pub), func(m *nats.Msg) { m.Respond(self) }); err != nil {
		t.Fatal(err)
	}
	reports, err := bus.SubscribeSync(manifest.StatsSubject("desk", "n"))
	if err != nil {
		t.Fatal(err)
	}
	bus.Flush()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Connect(ctx, srv.ClientURL(), seedFile, AsModule("desk"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if reporterRunning() {
		t.Fatal("a client that serves no tool runs a reporter")
	}
	if err := c.Serve("status", func(context.Context, Request) ([]byte, error) { return []byte(`"ok"`), nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.RequestWithContext(ctx, manifest.ToolSubject("desk", "status"), nil); err != nil {
		t.Fatal(err)
	}
	m, err := reports.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no report while the client serves: %v", err)
	}
	var r api.ToolStatsReport
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	if r.Instance != c.Instance() || r.Tools["status"].Count != 1 {
		t.Fatalf("report %+v, want one call of status by %s", r, c.Instance())
	}
	if !reporterRunning() {
		t.Fatal("no reporter goroutine, though a report came")
	}
}

// reporterRunning reports whether a goroutine of startReporting is running.
func reporterRunning() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "startReporting.func")
}
