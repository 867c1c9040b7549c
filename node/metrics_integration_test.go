//go:build integration

package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	dto "github.com/prometheus/client_model/go"
)

// thousandModules is a single node with 1,000 registered modules: m0 … m99 each declare a
// seat (seat0 … seat99), m100 … m999 each consume the events of the module before and use a
// seat.
func thousandModules(tb testing.TB) *bed {
	bd := newBedAt(tb, testConfig(tb.TempDir(), "alpha"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for i := range 1000 {
		text := fmt.Sprintf("module: m%d\nrequires: [mesh-bus]\nemits: [tick]\nconsumes: [m%d.tick]\nuses: [seat%d]\n", i, i-1, i%100)
		if i < 100 {
			text = fmt.Sprintf("module: m%d\nrequires: [mesh-bus]\nemits: [tick]\nseats:\n  seat%d: {scope: mesh, retain: 1d, accepts: [run]}\n", i, i)
		}
		if _, err := admin.Register(ctx, bd.op, []byte(text)); err != nil {
			tb.Fatalf("register module %d: %v", i, err)
		}
	}
	return bd
}

// TestIntegration_MetricsCardinality: with 1,000 modules registered and events flowing, every
// labelled series of the node's own metrics is about a module, node, seat, stream, consumer
// or vault verb that exists — none about an event — and there are no more than a few per
// module.
func TestIntegration_MetricsCardinality(t *testing.T) {
	bd := thousandModules(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	names := map[string]bool{"alpha": true, "node.alpha": true, "ok": true, "refused": true, // nodes, outcomes
		"accepted": true, "node": true, "module": true} // the controller's reports
	for i := range 1000 {
		names[fmt.Sprintf("m%d", i)] = true
		names[fmt.Sprintf("mod.m%d", i)] = true
		names[fmt.Sprintf("seat%d", i)] = true
	}
	// Events from 50 modules, 20 each: every one a series no more than its module.
	var emitted int
	for i := 100; i < 150; i++ {
		seed, _ := bd.register(fmt.Sprintf("module: load%d\nrequires: [mesh-bus]\nemits: [tick]\n", i))
		names[fmt.Sprintf("load%d", i)], names[fmt.Sprintf("mod.load%d", i)] = true, true
		c := bd.client(seed)
		for n := range 20 {
			if _, err := c.Emit(ctx, "tick", map[string]int{"n": n}); err != nil {
				t.Fatal(err)
			}
			emitted++
		}
	}
	var fams map[string]*dto.MetricFamily
	retryUntil(t, time.Minute, func() error {
		fams = scrape(t, bd.n.HTTPURL())
		var events float64
		for _, m := range fams["meshnode_events_total"].GetMetric() {
			events += m.GetCounter().GetValue()
		}
		if events < float64(emitted) {
			return fmt.Errorf("%v events counted, want at least %d", events, emitted)
		}
		return nil
	})
	streams, err := bd.n.Bus().Streams(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range streams {
		names[s.Name] = true
		for _, c := range s.Consumers {
			names[c.Name] = true
		}
	}
	for v := range vaultVerbNames {
		names[v] = true
	}
	// The controller's tools, as their subjects name them (whoami.<key> is whoami).
	for _, subject := range []string{api.RegisterSubject, api.RemoveSubject, api.ListSubject, api.PinSubject,
		api.DeploySubject, api.UndeploySubject, api.PsSubject, api.BuildsSubject, api.ProvisionsSubject,
		api.ProvideSubject, api.SeatListSubject, manifest.WhoamiSubjects} {
		_, tool, _ := strings.Cut(subject, ".tool.")
		tool, _, _ = strings.Cut(tool, ".")
		names[tool] = true
	}
	series := 0
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			series++
			for _, l := range m.GetLabel() {
				// Labels from a fixed set, not named after what is registered.
				if l.GetName() == "version" || l.GetName() == "go_version" || l.GetName() == "le" || l.GetName() == "reason" || l.GetName() == "kind" {
					continue
				}
				v := l.GetValue()
				if !names[v] && !strings.HasPrefix(v, "mesh-") && !strings.HasPrefix(v, "seat.") && !strings.HasPrefix(v, "node.") {
					t.Errorf("%s has a series labelled %s=%q, which names nothing registered", name, l.GetName(), v)
				}
			}
		}
	}
	t.Logf("%d series of meshnode's own metrics with 1,050 modules, 100 seats", series)
	if series > 10*1050 {
		t.Fatalf("%d series for 1,050 modules: more than 10 a module", series)
	}
}

// vaultVerbNames are the vault's verbs a metric may name.
var vaultVerbNames = map[string]bool{"mint": true, "fetch": true, "rotate": true, "ls": true, "token": true, "enrol": true,
	"identity": true, "server": true, "module": true, "intake": true, "provision": true, "unprovision": true, "other": true}
