package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/site"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
)

// TestSite_JoinsWithATokenAndEmitsIntoTheHub is issue 42 through a real node: a server with
// leaf-addr set is the hub; a join token enrols a site (site.Join, what `meshnode join --leaf`
// runs), which records it in the mesh's registry and tells it the hub's leafnode URL and
// nothing secret; the site opened from its data dir admits the hub's registered module by its
// own key, and the hub's EVENTS sources its events, each once, which the hub's audit log
// records as genuine. An emit the module did not declare is refused by the site.
func TestSite_JoinsWithATokenAndEmitsIntoTheHub(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hubCfg := testConfig(t.TempDir(), "alpha")
	hubCfg.LeafAddr = testbed.FreeAddr(t)
	b := newBedAt(t, hubCfg)
	seed, _ := b.register("module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\nuses: [desk]\n")
	serverSeed, _ := b.register("module: server\nrequires: [mesh-bus]\nseats:\n  desk: {scope: mesh, retain: 1h, accepts: [work], serves: [status]}\n")
	server := b.client(serverSeed)
	jobs := make(chan string, 16)
	if err := server.HoldSeat("desk", sdk.SeatHandlers{
		Serves: map[string]sdk.ToolHandler{
			"status": func(_ context.Context, r sdk.Request) ([]byte, error) { return []byte(`{"ok":true}`), nil },
		},
		Accepts: map[string]sdk.JobHandler{"work": func(_ context.Context, j sdk.Job) error { jobs <- j.ID; return nil }},
	}); err != nil {
		t.Fatal(err)
	}
	holder(t, "desk", server)

	var tok api.Token
	if _, err := vault.Call(ctx, b.op, api.VaultVerbToken, api.VaultCallerOperator, api.VaultRequest{TTL: "1h", Uses: 2}, &tok); err != nil {
		t.Fatal(err)
	}
	siteCfg := testConfig(t.TempDir(), "oslo")
	j, err := site.Join(ctx, siteCfg, tok.Token)
	if err != nil {
		t.Fatalf("join as a site: %v", err)
	}
	if j.MeshID != b.n.Identity().MeshID || len(j.Hub) != 1 || j.Hub[0] != "nats-leaf://"+hubCfg.LeafAddr {
		t.Fatalf("the site's enrolment: %+v, want mesh %s and hub nats-leaf://%s", j, b.n.Identity().MeshID, hubCfg.LeafAddr)
	}
	if _, err := site.Join(ctx, siteCfg, tok.Token); err == nil || !strings.Contains(err.Error(), "is site oslo") {
		t.Fatalf("a second join on the site's data dir: %v, want it refused", err)
	}
	other := testConfig(t.TempDir(), "alpha")
	if _, err := site.Join(ctx, other, tok.Token); err == nil || !strings.Contains(err.Error(), "has a server named alpha") {
		t.Fatalf("a site named as a server: %v, want it refused", err)
	}

	held, err := site.Load(siteCfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	hubTLS, err := held.TLS()
	if err != nil || hubTLS != nil {
		t.Fatalf("a loopback hub's link: TLS %v, %v; want plain", hubTLS, err)
	}
	s, err := site.Open(ctx, site.Config{Name: held.Name, StoreDir: filepath.Join(siteCfg.DataDir, datadir.JetStreamDir),
		ClientAddr: testbed.FreeAddr(t), Key: held.Key, HubURLs: held.Hub, HubTLS: hubTLS, DB: held.Store()})
	if err != nil {
		t.Fatalf("open the site: %v", err)
	}
	defer s.Close()

	shop, err := sdk.Connect(ctx, s.Bus().ClientURL(), seed)
	if err != nil {
		t.Fatalf("the hub's module connects to the site: %v", err)
	}
	defer shop.Close()
	const n = 5
	ids := map[string]bool{}
	for i := range n {
		id, err := shop.Emit(ctx, "order.placed", map[string]int{"n": i})
		if err != nil {
			t.Fatalf("emit on the site: %v", err)
		}
		ids[id] = true
	}
	subject := manifest.EventSubject("shop", "order.placed")
	start := time.Now()
	retryUntil(t, 90*time.Second, func() error {
		if got := eventsOn(t, b, subject); got != n {
			return fmt.Errorf("the hub's EVENTS holds %d of the site's %d events", got, n)
		}
		return nil
	})
	t.Logf("the hub's EVENTS sourced the site's %d events %s after they were acked", n, time.Since(start).Round(time.Millisecond))
	retryUntil(t, 30*time.Second, func() error {
		recs := b.auditAll("shop")
		genuine := 0
		for _, r := range recs {
			if ids[r.EventID] && r.Signed {
				genuine++
			}
		}
		if genuine != n || len(recs) != n {
			return fmt.Errorf("the hub's audit log has %d records of shop, %d of them the site's events and genuine; want %d", len(recs), genuine, n)
		}
		return nil
	})

	// A seat's tool, held on the hub, answers the site's module across the link.
	retryUntil(t, 30*time.Second, func() error {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		defer ccancel()
		reply, err := shop.Call(cctx, "desk", "status", map[string]any{})
		if err == nil && string(reply) != `{"ok":true}` {
			return fmt.Errorf("desk answered %q", reply)
		}
		return err
	})

	// A seat's job submitted on the site is queued on the hub and handled by its holder.
	var jobID string
	retryUntil(t, 30*time.Second, func() error {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		defer ccancel()
		jobID, err = shop.Submit(cctx, "desk", "work", map[string]int{"n": 1})
		return err
	})
	select {
	case got := <-jobs:
		if got != jobID {
			t.Fatalf("the holder handled job %s, want the site's %s", got, jobID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the holder on the hub never handled the job submitted on the site")
	}

	// A module registered after the site linked is answered there too: the link reconnects
	// with the new module's inbox.
	lateSeed, _ := b.register("module: late\nrequires: [mesh-bus]\nuses: [desk]\n")
	retryUntil(t, 30*time.Second, func() error {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		defer ccancel()
		late, err := sdk.Connect(cctx, s.Bus().ClientURL(), lateSeed)
		if err != nil {
			return err
		}
		defer late.Close()
		_, err = late.Call(cctx, "desk", "status", map[string]any{})
		return err
	})

	nc := connect(t, s.Bus().ClientURL(), seed, nats.CustomInboxPrefix(manifest.InboxPrefix("shop")))
	defer nc.Close()
	if !refusedPub(t, nc, manifest.EventSubject("shop", "order.refunded")) {
		t.Error("the site let the module emit an event it did not declare")
	}

	// Cut off, the site refuses the undeclared emit still, acks its module's emits, and a tool
	// call fails at once with the reason instead of waiting out its timeout.
	sitePub, _ := held.Key.PublicKey()
	if cut := b.n.Bus().BarSite(sitePub, "oslo", time.Now().Add(time.Hour)); cut != 1 {
		t.Fatalf("cut %d links, want 1", cut)
	}
	retryUntil(t, 30*time.Second, func() error {
		if s.Bus().Linked() {
			return errors.New("the site is still linked")
		}
		return nil
	})
	if !refusedPub(t, nc, manifest.EventSubject("shop", "order.refunded")) {
		t.Error("the site let the module emit an event it did not declare, cut off")
	}
	if _, err := shop.Emit(ctx, "order.placed", map[string]int{"n": n}); err != nil {
		t.Fatalf("emit on the site, cut off: %v", err)
	}
	called := time.Now()
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	_, err = shop.Call(cctx, "desk", "status", map[string]any{})
	if err == nil || time.Since(called) > 5*time.Second {
		t.Fatalf("a tool call across a cut link: %v after %s, want a prompt error", err, time.Since(called).Round(time.Millisecond))
	}
	t.Logf("a tool call across the cut link failed after %s: %v", time.Since(called).Round(time.Millisecond), err)
	submitted := time.Now()
	if _, err := shop.Submit(cctx, "desk", "work", map[string]int{"n": 2}); err == nil || time.Since(submitted) > 5*time.Second {
		t.Fatalf("a seat's job across a cut link: %v after %s, want a prompt error", err, time.Since(submitted).Round(time.Millisecond))
	} else {
		t.Logf("a seat's job across the cut link failed after %s: %v", time.Since(submitted).Round(time.Millisecond), err)
	}
	b.n.Bus().BarSite(sitePub, "oslo", time.Now())
	retryUntil(t, 60*time.Second, func() error {
		if got := eventsOn(t, b, subject); got != n+1 {
			return fmt.Errorf("the hub's EVENTS holds %d of the site's %d events", got, n+1)
		}
		return nil
	})

	// The site's own audit log holds every event its module emitted, linked and cut off, each
	// once and genuine; the operator reads it on the site.
	op := connect(t, s.Bus().ClientURL(), filepath.Join(b.dir, datadir.OperatorSeedFile), nats.CustomInboxPrefix(manifest.OperatorInbox))
	defer op.Close()
	retryUntil(t, 30*time.Second, func() error {
		reply, err := audit.Call(ctx, op, "oslo", api.AuditRequest{Op: "query", Filter: api.AuditFilter{Source: "shop", Limit: 100}})
		if err != nil {
			return err
		}
		genuine := 0
		for _, r := range reply.Records {
			if r.Signed {
				genuine++
			}
		}
		if len(reply.Records) != n+1 || genuine != n+1 {
			return fmt.Errorf("the site's audit log holds %d records of shop, %d genuine; want %d", len(reply.Records), genuine, n+1)
		}
		return nil
	})
}
