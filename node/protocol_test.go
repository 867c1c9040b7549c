package node_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// reportCount reads the node's count of report jobs with outcome from /metrics.
func reportCount(t *testing.T, b *bed, outcome string) int {
	t.Helper()
	code, body := httpGet(t, b.n.HTTPURL()+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	m := regexp.MustCompile(`(?m)^meshnode_controller_reports_total\{outcome="` + outcome + `"\} (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestProtocol_ReportReachesTheController: the mesh's own seats carry their protocol from
// the built-in manifest, so `uses: [mesh-controller]` and a Submit of a report job reach the
// controller's holder, which checks the job and takes it off the work queue. A verb outside
// the protocol is refused by the sdk; a report forged under another module's name (signed
// by the forger's key) is refused by the holder.
func TestProtocol_ReportReachesTheController(t *testing.T) {
	b := newBed(t)
	hostSeed, _ := b.register("module: host\nrequires: [mesh-bus]\nuses: [mesh-controller]\n")
	forgerSeed, _ := b.register("module: forger\nrequires: [mesh-bus]\nuses: [mesh-controller]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c := b.client(hostSeed)
	if _, err := c.Submit(ctx, manifest.ControllerSeat, "report", map[string]any{"node": "alpha", "applied": 3}); err != nil {
		t.Fatalf("submit a report: %v", err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if n := reportCount(t, b, "accepted"); n != 1 {
			return fmt.Errorf("%d reports accepted by the controller's holder, want 1", n)
		}
		return nil
	})
	var queue string
	for _, s := range manifest.Builtin().Seats {
		if s.Name == manifest.ControllerSeat {
			queue = s.Stream.Name
		}
	}
	retryUntil(t, 5*time.Second, func() error {
		st, err := b.js.Stream(ctx, queue)
		if err != nil {
			return err
		}
		if st.CachedInfo().State.Msgs != 0 {
			return fmt.Errorf("%s holds %d jobs after the holder took the report", queue, st.CachedInfo().State.Msgs)
		}
		return nil
	})
	if _, err := c.Submit(ctx, manifest.ControllerSeat, "deploy", nil); !errors.Is(err, sdk.ErrNotDeclared) {
		t.Fatalf("submit a verb mesh-controller does not accept: %v, want ErrNotDeclared", err)
	}

	// The forger may publish on the report subject (it uses the seat) but signs as itself.
	seed, err := os.ReadFile(forgerSeed)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	key, err := envelope.NewSigningKey(kp)
	if err != nil {
		t.Fatal(err)
	}
	subject := manifest.SeatAcceptSubject(manifest.ControllerSeat, "report")
	body := []byte(`{"node":"alpha","applied":0}`)
	h, err := envelope.Stamp(key, "host", "alpha", subject, body, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(b.raw(forgerSeed, "forger"))
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: body}); err != nil {
		t.Fatalf("publish the forged report: %v", err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if n := reportCount(t, b, "refused"); n != 1 {
			return fmt.Errorf("%d reports refused, want the forged one", n)
		}
		return nil
	})
	if n := reportCount(t, b, "accepted"); n != 1 {
		t.Fatalf("%d reports accepted after the forgery, want still 1", n)
	}
}
