package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/toolstats"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads the node's /metrics: each family of meshnode's own by name.
func scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	all, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for name := range all {
		if !strings.HasPrefix(name, "meshnode_") {
			delete(all, name)
		}
	}
	return all
}

// TestMetrics_Golden: after a little of everything — a module's events, a seat held, a dead
// letter, vault requests — the node's own metric families are exactly those of
// testdata/metrics.golden, with their types, named by Prometheus's conventions (counters end
// in _total, durations are _seconds), and each labelled series is about a module, seat,
// stream or consumer that exists.
func TestMetrics_Golden(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	shopSeed, _ := b.register("module: shop\nrequires: [mesh-bus]\nemits: [order]\nsecrets: [key, unminted]\n")
	sinkSeed, _ := b.register("module: sink\nrequires: [mesh-bus]\nconsumes: [shop.order]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := vault.Call(ctx, b.op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: "key"}, nil); err != nil {
		t.Fatal(err)
	}
	shop := b.client(shopSeed)
	if _, err := shop.Secret(ctx, "key"); err != nil {
		t.Fatal(err)
	}
	if _, err := shop.Secret(ctx, "unminted"); err == nil {
		t.Fatal("a secret never minted was fetched")
	}
	sink := b.client(sinkSeed)
	if err := sink.On("shop.order", func(context.Context, sdk.Event) error {
		return fmt.Errorf("%w: refused", sdk.ErrShape)
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := shop.Emit(ctx, "order", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	awaitDead(t, b, manifest.DeadSubject(manifest.EventsStreamName, "sink"), 3, nil)

	// A module's own tool and its seat's, timed by its sdk and reported at its close.
	deskSeed, _ := b.register("module: desk\nrequires: [mesh-bus]\ntools: [status]\nseats:\n  help: {scope: mesh, serves: [ask]}\n")
	askerSeed, _ := b.register("module: asker\nrequires: [mesh-bus]\nuses: [help]\n")
	desk := b.client(deskSeed)
	answer := func(context.Context, sdk.Request) ([]byte, error) { return []byte(`"ok"`), nil }
	if err := desk.Serve("status", answer); err != nil {
		t.Fatal(err)
	}
	if err := desk.HoldSeat("help", sdk.SeatHandlers{Serves: map[string]sdk.ToolHandler{"ask": answer}}); err != nil {
		t.Fatal(err)
	}
	answered := 0 // the holder's grant reconnects it: calls find no responder meanwhile
	retryUntil(t, 10*time.Second, func() error {
		for answered < 4 {
			if _, err := b.op.RequestWithContext(ctx, manifest.ToolSubject("desk", "status"), nil); err != nil {
				return err
			}
			answered++
		}
		return nil
	})
	asker := b.client(askerSeed)
	retryUntil(t, 10*time.Second, func() error {
		_, err := asker.Call(ctx, "help", "ask", nil) // once the seat is held
		return err
	})
	// Reports the node does not take: another node's instance, an undeclared tool.
	forged := func(node, tool string) []byte {
		b, _ := json.Marshal(api.ToolStatsReport{Instance: "x", Node: node, Tools: map[string]api.ToolHistogram{tool: {Count: 7, Buckets: make([]uint64, len(toolstats.Buckets))}}})
		return b
	}
	b.op.Publish(manifest.StatsSubject("desk", "alpha"), forged("elsewhere", "status"))
	b.op.Publish(manifest.StatsSubject("desk", "alpha"), forged("alpha", "undeclared"))
	desk.Close()

	var fams map[string]*dto.MetricFamily
	retryUntil(t, 20*time.Second, func() error {
		fams = scrape(t, b.n.HTTPURL())
		for _, name := range []string{"meshnode_events_total", "meshnode_dead_letters_total", "meshnode_vault_requests_total"} {
			if fams[name] == nil {
				return errors.New(name + " not scraped yet")
			}
		}
		if v := counter(fams, "meshnode_events_total", "owner", "mod.shop"); v != 3 {
			return fmt.Errorf("meshnode_events_total{owner=mod.shop} %v, want 3", v)
		}
		if len(matching(fams, "meshnode_module_tool_call_duration_seconds", "module", "desk")) == 0 {
			return errors.New("desk's tool latency not reported yet")
		}
		return nil
	})
	var got []string
	for name, f := range fams {
		got = append(got, name+" "+strings.ToLower(f.GetType().String()))
		switch {
		case f.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total"):
			t.Errorf("counter %s does not end in _total", name)
		case strings.Contains(name, "duration") && !strings.HasSuffix(name, "_seconds"):
			t.Errorf("duration %s is not in seconds", name)
		}
	}
	slices.Sort(got)
	want, err := os.ReadFile("testdata/metrics.golden")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "\n") != strings.TrimSpace(string(want)) {
		t.Fatalf("metric families differ from testdata/metrics.golden (update it with the change, and docs/http.md):\n%s", strings.Join(got, "\n"))
	}
	for _, c := range []struct {
		family, label, value string
		want                 float64
	}{
		{"meshnode_dead_letters_total", "consumer", "sink", 3},
		{"meshnode_vault_requests_total", "verb", "fetch", 2},
		{"meshnode_vault_requests_total", "outcome", "refused", 1},
		{"meshnode_seat_holder_changes_total", "seat", manifest.ControllerSeat, 1},
	} {
		if v := counter(fams, c.family, c.label, c.value); v != c.want {
			t.Errorf("%s{%s=%q} = %v, want %v", c.family, c.label, c.value, v, c.want)
		}
	}
	// Every vault request is timed, and the controller's whoami (each connect asks it).
	if n := samples(fams, "meshnode_tool_call_duration_seconds", "seat", manifest.VaultSeat, "tool", "fetch"); n != 2 {
		t.Errorf("meshnode_tool_call_duration_seconds{seat=mesh-vault,tool=fetch} has %d samples, want 2", n)
	}
	if n := samples(fams, "meshnode_tool_call_duration_seconds", "seat", manifest.ControllerSeat, "tool", "whoami"); n < 1 {
		t.Errorf("meshnode_tool_call_duration_seconds{seat=mesh-controller,tool=whoami} has %d samples, want some", n)
	}
	if n := samples(fams, "meshnode_module_tool_call_duration_seconds", "module", "desk", "tool", "status"); n != 4 {
		t.Errorf("meshnode_module_tool_call_duration_seconds{module=desk,tool=status} has %d samples, want 4", n)
	}
	if n := samples(fams, "meshnode_module_tool_call_duration_seconds", "module", "desk", "tool", "seat.help.ask"); n < 1 {
		t.Errorf("meshnode_module_tool_call_duration_seconds{module=desk,tool=seat.help.ask} has %d samples, want the calls that were answered", n)
	}
	if n := len(matching(fams, "meshnode_module_tool_call_duration_seconds", "tool", "undeclared")); n != 0 {
		t.Errorf("an undeclared tool's forged report was taken")
	}
	// sink was delivered each event (the sdk gives a refused shape up at once: terminated,
	// which acknowledges it): what it consumed.
	if d, a := counter(fams, "meshnode_consumer_delivered_total", "consumer", "sink"), counter(fams, "meshnode_consumer_acked_total", "consumer", "sink"); d != 3 || a != 3 {
		t.Errorf("consumer sink delivered %v, acked %v; want 3 and 3", d, a)
	}
	if v := gauge(fams, "meshnode_consumer_pending_messages", "consumer", "sink"); v != 0 {
		t.Errorf("consumer sink's lag %v, want 0 (it gave every event up)", v)
	}
}

// matching are family's series whose labels have the values given, in name, value pairs.
func matching(fams map[string]*dto.MetricFamily, family string, labels ...string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range fams[family].GetMetric() {
		has := map[string]string{}
		for _, l := range m.GetLabel() {
			has[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && has[labels[i]] == labels[i+1]
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

// counter sums family's counters whose labels have the values given, in name, value pairs.
func counter(fams map[string]*dto.MetricFamily, family string, labels ...string) float64 {
	var sum float64
	for _, m := range matching(fams, family, labels...) {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// samples is how many observations family's histograms with the labels given hold.
func samples(fams map[string]*dto.MetricFamily, family string, labels ...string) uint64 {
	var n uint64
	for _, m := range matching(fams, family, labels...) {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

// gauge is counter for gauges; -1 when there is no such series.
func gauge(fams map[string]*dto.MetricFamily, family, label, value string) float64 {
	for _, m := range fams[family].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// TestMetrics_GrafanaDashboard: the example dashboard in scripts/ queries only metrics the
// node exports (testdata/metrics.golden).
func TestMetrics_GrafanaDashboard(t *testing.T) {
	t.Parallel()
	golden, err := os.ReadFile("testdata/metrics.golden")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for line := range strings.Lines(string(golden)) {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			known[name] = true
		}
	}
	dash, err := os.ReadFile("../scripts/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	used := regexp.MustCompile(`meshnode_[a-z_]+`).FindAllString(string(dash), -1)
	if len(used) == 0 {
		t.Fatal("the dashboard queries no meshnode metric")
	}
	for _, name := range used {
		if !known[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")] {
			t.Errorf("scripts/grafana-dashboard.json queries %s, which the node does not export", name)
		}
	}
}

// TestOperator_SystemAccount: the operator's key, connecting under the name
// embedbus.SystemConnection, is in the server's system account, where NATS's own tools ask
// servers for their state (`nats server report jetstream`); a module's key under that name
// is not, and the operator's under any other name is in the mesh's account as always.
func TestOperator_SystemAccount(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: shop\nrequires: [mesh-bus]\nemits: [sold]\n")
	ask := func(seedFile string) error {
		nc := connect(t, b.n.ClientURL(), seedFile, nats.Name(embedbus.SystemConnection))
		defer nc.Close()
		msg, err := nc.Request("$SYS.REQ.SERVER.PING.JSZ", nil, 2*time.Second)
		if err != nil {
			return err
		}
		if !strings.Contains(string(msg.Data), `"name":"alpha"`) {
			return fmt.Errorf("JSZ answered %.200s", msg.Data)
		}
		return nil
	}
	if err := ask(filepath.Join(b.dir, datadir.OperatorSeedFile)); err != nil {
		t.Fatalf("the operator's system connection: %v", err)
	}
	if err := ask(seed); err == nil {
		t.Fatal("a module's key reached the system account")
	}
	// The operator's usual connection still speaks the mesh's API.
	if _, err := b.js.AccountInfo(context.Background()); err != nil {
		t.Fatalf("the operator's own connection: %v", err)
	}
}
