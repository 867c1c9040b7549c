package dashboard

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
)

// TestDashboard_StateJSON pins the JSON the dashboard's page reads (a snapshot with every
// part set, the modules and edges spliced in), its login challenge, its deploy form, a
// module's page and the message an operator signs to log in: testdata/dashboard.golden, one per line.
func TestDashboard_StateJSON(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)
	entries := []*registry.Entry{
		{Manifest: &manifest.Manifest{Module: "shop", Requires: []string{"mesh-bus", "postgres"}, Emits: []string{"order.placed"},
			Tools: []string{"status"}, Uses: []string{"mailer"}, Secrets: []string{"stripe"}}},
		{Manifest: &manifest.Manifest{Module: "billing", Requires: []string{"mesh-bus"}, Consumes: []string{"shop.order.placed"}}},
		{Manifest: &manifest.Manifest{Module: "audit-all", Requires: []string{"mesh-bus"}, Consumes: []string{"*.order.*"}}},
		{Manifest: &manifest.Manifest{Module: "mail", Requires: []string{"mesh-bus"},
			Seats: []manifest.Seat{{Name: "mailer", Scope: manifest.ScopeMesh, Retain: "1h", Accepts: []string{"send"}}}}},
	}
	for _, e := range entries {
		e.Module = e.Manifest.Module
	}
	st := State{
		Node: "alpha", MeshID: "mesh-1", Time: at,
		Members: []Member{{Name: "alpha", Address: "nats://127.0.0.1:4222", GossipAddr: "127.0.0.1:7946", State: "alive", JetStream: "leader", Seats: []string{"mailer"}}},
		Seats: []api.SeatStatus{{Seat: "mailer", Scope: manifest.ScopeMesh, Module: "mail", Holder: "mail/1", HolderAt: "alpha", Epoch: 3, Since: &at,
			Backlog: 2, Users: []string{"shop"}, Versions: []api.SeatVersionStatus{{Version: "v1", Bound: []string{"shop"}}}}},
		Streams: []Stream{{Name: "EVENTS", Messages: 10, Bytes: 2048, Replicas: 3,
			Consumers: []Consumer{{Name: "billing", Pending: 1, AckPending: 2, Redelivered: 3}}}},
		Processes: []api.Process{{Module: "shop", Node: "alpha", Version: "1", Instance: 1, Revision: 4, Declared: 5, State: "running",
			PID: 99, Restarts: 1, Since: at, Reason: "restarted", Reported: at}},
		Audit:      []AuditRecord{{N: 7, Received: at, Event: "shop.order.placed", Source: "shop", Signed: true, Check: "ok", Body: `{"id":1}`}},
		NotGenuine: map[string]uint64{"bad-signature": 1},
		Dead:       []DeadLetter{{ID: 12, Time: at, Event: "shop.order.placed", Consumer: "billing", Reason: "max deliveries", Deliveries: 5}},
		DeadTotal:  1, Errors: []string{"processes: timeout"},
		Quotas: map[string]api.QuotaUse{"shop": {Module: "shop", Held: 1 << 20, Pending: 2048, Limit: 32 << 20,
			Refused: map[string]uint64{"quota": 0, "audit-behind": 3, "rate": 0, "not-admitted": 0}}},
		Rates: &Rates{EveryMS: 10_000, End: at, Events: []uint64{40, 52}, Errors: []uint64{0, 1}},
	}
	var got bytes.Buffer
	got.Write(st.encode(newModuleGraph(0, entries).encoded))
	got.WriteByte('\n')
	page := ModulePage{Module: "shop", PublicKey: "UABC", Registered: at, Updated: at, Manifest: "module: shop\n",
		Permissions: manifest.Permissions{Publish: []string{"mesh.admit.shop.mesh.mod.shop.event.order"}, Subscribe: []manifest.Subscription{{Subject: "_INBOX.shop.>"}}},
		Seats:       []api.SeatStatus{}, Talks: []Edge{{From: "shop", To: "billing", Kind: "events", What: "order"}},
		Consumers: []StreamConsumer{{Stream: "EVENTS", Consumer: Consumer{Name: "shop", Pending: 1}}}, Processes: st.Processes, Events: st.Audit,
		Logs: ModuleLogs{Node: "alpha", Text: "hello\n"}, Provisions: []api.Provision{}, Quota: &api.QuotaUse{Module: "shop", Held: 10, Limit: 100},
		Builds: []api.Build{{Module: "shop", Status: "built", Version: "2", Commit: "abc", Started: at, Finished: at, Trigger: "pushed shop main"}},
		Errors: []string{"provisions: timeout"}}
	for _, v := range []any{Challenge{Node: "alpha", MeshID: "mesh-1", Nonce: "n0nce"},
		DeployRequest{Module: "shop", Version: "2", Nodes: []string{"alpha"}, Instances: 2}, page} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got.Write(b)
		got.WriteByte('\n')
	}
	got.Write(LoginMessage("mesh-1", "alpha", "n0nce", modeReadOnly))
	got.WriteByte('\n')
	want, err := os.ReadFile("testdata/dashboard.golden")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("the dashboard's JSON differs from testdata/dashboard.golden (the page reads it: change both on purpose):\ngot:\n%s\nwant:\n%s", got.Bytes(), want)
	}
}
