package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/dashboard"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/registry"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// mesh is one node alone, with no streams and no seats.
type mesh struct{}

func (mesh) Members() []dashboard.Member {
	return []dashboard.Member{{Name: "alpha", State: "alive", JetStream: "standalone", Seats: []string{}}}
}
func (mesh) Streams(bool) ([]embedbus.StreamState, error)              { return nil, nil }
func (mesh) Seats(func(stream string) (uint64, bool)) []api.SeatStatus { return nil }

// reg is a registry with no modules whose operator is op.
type reg struct{ op string }

func (reg) Revision() uint64                   { return 1 }
func (reg) List() []*registry.Entry            { return nil }
func (reg) Get(string) (*registry.Entry, bool) { return nil, false }
func (r reg) Operator() string                 { return r.op }

// auditLog is an empty audit log.
type auditLog struct{}

func (auditLog) Changes() uint64                                  { return 0 }
func (auditLog) Query(api.AuditFilter) ([]api.AuditRecord, error) { return nil, nil }
func (auditLog) NotGenuine() map[string]uint64                    { return nil }

// TestDashboard_Close: a logged-in browser's event stream gets the snapshot; Close ends the
// stream and the snapshot loop and waits for them, and a request after it is refused.
func TestDashboard_Close(t *testing.T) {
	nc, js := testbed.Connect(t, testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()}))
	op, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := op.PublicKey()
	d := dashboard.Open(context.Background(), dashboard.Config{Node: "alpha", MeshID: "mesh-1", Mesh: mesh{}, Registry: reg{pub},
		Audit: auditLog{}, Conn: nc, JetStream: js, Log: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { d.Close() })
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)

	browser := logIn(t, srv.URL, op, true)
	resp, err := browser.Get(srv.URL + "/ui/api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	var st dashboard.State
	for lines.Scan() {
		if data, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
			if err := json.Unmarshal([]byte(data), &st); err != nil {
				t.Fatalf("event data: %v", err)
			}
			break
		}
	}
	if len(st.Members) != 1 || st.Members[0].Name != "alpha" {
		t.Fatalf("the stream's first snapshot: %+v (%v), want alpha alone", st, lines.Err())
	}
	if got, want := d.Watchers(), 1; got != want {
		t.Fatalf("Watchers()=%d, want %d", got, want)
	}

	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close has not returned in 10 s: it waits for a stream or the snapshot loop that did not end")
	}
	if got, want := d.Watchers(), 0; got != want {
		t.Fatalf("Watchers() after Close=%d, want %d", got, want)
	}
	for lines.Scan() { // the stream ends
	}
	resp, err = browser.Get(srv.URL + "/ui/api/state")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got, want := resp.StatusCode, http.StatusServiceUnavailable; got != want {
		t.Fatalf("a request after Close: %d, want %d", got, want)
	}
}
