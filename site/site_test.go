package site_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/controller"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/site"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 30 * time.Second

// hubDirectory admits the hub's own key with every permission, and the site's node key as a
// site's link.
type hubDirectory map[string]embedbus.Identity

func (d hubDirectory) Identity(pub, _ string) (embedbus.Identity, bool) {
	id, ok := d[pub]
	return id, ok
}

func newKey(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	return kp, pub
}

// violations counts the permission violations a connection is told of, by subject.
type violations struct {
	mu sync.Mutex
	n  map[string]int
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, f := range strings.Fields(err.Error()) {
		if strings.HasPrefix(f, `"mesh.`) {
			v.n[strings.Trim(f, `"`)]++
		}
	}
}

func (v *violations) of(subject string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.n[subject]
}

// bed is a hub (an embedded bus serving sites, with the mesh's registry and module shop
// registered in it, and EVENTS sourcing the site) and the site oslo linked to it.
type bed struct {
	hub     *embedbus.Bus
	hubJS   jetstream.JetStream
	site    *site.Site
	sitePub string
	shopKey nkeys.KeyPair
	shopPub string
}

func newBed(t *testing.T, ctx context.Context) *bed {
	t.Helper()
	b := &bed{}
	hubKey, hubPub := newKey(t)
	siteKey, sitePub := newKey(t)
	b.sitePub = sitePub
	link := manifest.SiteLink("oslo", []string{"shop"}, "KV_"+registry.Bucket)
	leafAddr := testbed.FreeAddr(t)
	hub, err := embedbus.Open(ctx, embedbus.Config{Name: "hub", StoreDir: t.TempDir(), ClientAddr: testbed.FreeAddr(t), Key: hubKey,
		Directory: hubDirectory{
			hubPub:  {Name: "node:hub"},
			sitePub: {Name: "site:oslo", Leaf: true, Permissions: &link, PublishDeny: manifest.SiteDenied(), SubscribeDeny: manifest.SiteDenied()},
		},
		Domain: manifest.HubDomain, Leaf: &embedbus.LeafListen{Addr: leafAddr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	b.hub, b.hubJS = hub, hub.JetStream()
	reg := registry.New(nil, nil)
	if err := reg.Open(ctx, b.hubJS, 1, 0); err != nil {
		t.Fatal(err)
	}
	rctx, rstop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- reg.Run(rctx) }()
	t.Cleanup(func() { rstop(); <-ran; reg.Close() })
	b.shopKey, b.shopPub = newKey(t)
	now := time.Now().UTC()
	if _, err := reg.Put(ctx, registry.Record{Module: "shop", Manifest: "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n",
		PublicKey: b.shopPub, Registered: now, Updated: now}, 0); err != nil {
		t.Fatal(err)
	}
	s, err := site.Open(ctx, site.Config{Name: "oslo", StoreDir: t.TempDir(), ClientAddr: testbed.FreeAddr(t), Key: siteKey,
		HubURLs: []string{"nats-leaf://" + leafAddr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b.site = s
	testbed.RetryUntil(t, wait, func() error {
		if !s.Bus().Linked() {
			return errors.New("the site is not linked")
		}
		return nil
	})
	// The hub's EVENTS sources the site once it is linked: a source made before has its
	// first consumer create unanswered, and nats-server retries it only 10–40 s later.
	if _, err := b.hubJS.CreateStream(ctx, jetstream.StreamConfig{Name: manifest.EventsStreamName, Subjects: manifest.EventPatterns(),
		Sources: []*jetstream.StreamSource{controller.SiteSource("oslo")}}); err != nil {
		t.Fatal(err)
	}
	return b
}

// hubHolds waits until the hub's EVENTS holds n events.
func (b *bed) hubHolds(t *testing.T, ctx context.Context, n uint64) {
	t.Helper()
	testbed.RetryUntil(t, wait, func() error {
		st, err := b.hubJS.Stream(ctx, manifest.EventsStreamName)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != n {
			return fmt.Errorf("the hub's EVENTS holds %d events, want %d", info.State.Msgs, n)
		}
		return nil
	})
}

// TestSite_EmitsWhileCutOff (issue 42): a module registered on the hub connects to a site with
// its own key, and the site authorises it from its mirror of the hub's registry; its emits
// are stored on the site and sourced into the hub's EVENTS, each once, while the link is up
// and after a cut; an emit it did not declare is refused by the site both while linked and
// while cut off.
func TestSite_EmitsWhileCutOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	b := newBed(t, ctx)
	s, hub, shopKey, shopPub, sitePub := b.site, b.hub, b.shopKey, b.shopPub, b.sitePub
	denied := &violations{n: map[string]int{}}
	nc, err := nats.Connect(s.Bus().ClientURL(), nats.Nkey(shopPub, shopKey.Sign), nats.CustomInboxPrefix(manifest.InboxPrefix("shop")),
		nats.ErrorHandler(denied.handler))
	if err != nil {
		t.Fatalf("shop connects to the site with its own key: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	sk, _ := envelope.NewSigningKey(shopKey)
	placed := manifest.EventSubject("shop", "order.placed")
	emit := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			body := fmt.Appendf(nil, `{"order":%d}`, i)
			h, _ := envelope.Stamp(sk, "shop", "oslo", placed, body, envelope.Options{})
			ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.AdmitSubject("shop", placed), Header: h, Data: body})
			if err != nil {
				t.Fatalf("emit %d: %v", i, err)
			}
			if ack.Stream != manifest.SiteEventsStreamName {
				t.Fatalf("emit %d stored in %s, want the site's %s", i, ack.Stream, manifest.SiteEventsStreamName)
			}
		}
	}
	undeclared := func() {
		t.Helper()
		refund := manifest.EventSubject("shop", "refund")
		before := denied.of(manifest.AdmitSubject("shop", refund))
		nc.Publish(manifest.AdmitSubject("shop", refund), []byte(`{}`))
		testbed.RetryUntil(t, wait, func() error {
			if denied.of(manifest.AdmitSubject("shop", refund)) == before {
				return errors.New("the site has not refused shop's undeclared emit")
			}
			return nil
		})
	}
	emit(0, 20)
	undeclared()
	b.hubHolds(t, ctx, 20)

	if n := hub.BarSite(sitePub, "oslo", time.Now().Add(time.Hour)); n != 1 {
		t.Fatalf("cut %d links, want 1", n)
	}
	testbed.RetryUntil(t, wait, func() error {
		if s.Bus().Linked() {
			return errors.New("the site is still linked")
		}
		return nil
	})
	emit(20, 50)
	undeclared()
	hub.BarSite(sitePub, "oslo", time.Now())
	b.hubHolds(t, ctx, 50)
}

// TestSite_SDKModule: the Go sdk connects to a site as to a node — the site answers its
// whoami from its copy of the registry — and what it emits reaches the hub's EVENTS.
func TestSite_SDKModule(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	b := newBed(t, ctx)
	seed, _ := b.shopKey.Seed()
	seedFile := filepath.Join(t.TempDir(), "shop.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := sdk.Connect(ctx, b.site.Bus().ClientURL(), seedFile)
	if err != nil {
		t.Fatalf("the sdk connects to the site: %v", err)
	}
	defer c.Close()
	for i := range 5 {
		if _, err := c.Emit(ctx, "order.placed", map[string]int{"order": i}); err != nil {
			t.Fatalf("emit %d: %v", i, err)
		}
	}
	if _, err := c.Emit(ctx, "refund", map[string]int{"order": 1}); !errors.Is(err, sdk.ErrNotDeclared) {
		t.Fatalf("an undeclared emit: %v, want ErrNotDeclared", err)
	}
	b.hubHolds(t, ctx, 5)
}
