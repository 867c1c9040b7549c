package embedbus

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// idents is a Directory of fixed identities.
type idents struct {
	mu    sync.Mutex
	ids   map[string]Identity
	asked map[string]int
}

func (d *idents) Identity(pub, _ string) (Identity, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked[pub]++
	id, ok := d.ids[pub]
	return id, ok
}

func (d *idents) timesAsked(kp nkeys.KeyPair) int {
	pub, _ := kp.PublicKey()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked[pub]
}

func (d *idents) set(kp nkeys.KeyPair, id Identity) {
	pub, _ := kp.PublicKey()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ids[pub] = id
}

const testEvents = manifest.AllEvents

// linkPerms are a site link's permissions as a hub grants them: manifest.SiteLink, for a
// site that mirrors the hub's bucket reg.
func linkPerms(site string) (*manifest.Permissions, []string) {
	p := manifest.SiteLink(site, nil, "KV_reg")
	return &p, manifest.SiteDenied()
}

type siteBed struct {
	hubDir, siteDir *idents
	hubKey, siteKey nkeys.KeyPair
	moduleKey       nkeys.KeyPair
	leaf            string
	hub, site       *Bus
	hubJS, siteJS   jetstream.JetStream
}

// newSiteBed opens a hub and a site linked to it; the site's node key is admitted by the
// hub as a leafnode with linkPerms.
func newSiteBed(t *testing.T) *siteBed {
	t.Helper()
	s := &siteBed{hubDir: &idents{ids: map[string]Identity{}, asked: map[string]int{}}, siteDir: &idents{ids: map[string]Identity{}, asked: map[string]int{}}, leaf: testbed.FreeAddr(t)}
	s.hubKey, _ = newUser(t)
	s.siteKey, _ = newUser(t)
	s.moduleKey, _ = newUser(t)
	s.hubDir.set(s.hubKey, Identity{Name: "node:hub"})
	perms, deny := linkPerms("site1")
	s.hubDir.set(s.siteKey, Identity{Name: "site:site1", Leaf: true, Permissions: perms, PublishDeny: deny, SubscribeDeny: deny})
	s.siteDir.set(s.siteKey, Identity{Name: "node:site1"})
	s.siteDir.set(s.moduleKey, Identity{Name: "module:m", Permissions: &manifest.Permissions{Publish: []string{"mesh.mod.m.event.>"}, Subscribe: []manifest.Subscription{{Subject: "_INBOX.>"}}}})
	hub, err := Open(context.Background(), Config{Name: "hub", StoreDir: t.TempDir(), ClientAddr: testbed.FreeAddr(t), Directory: s.hubDir, Key: s.hubKey,
		Domain: manifest.HubDomain, Leaf: &LeafListen{Addr: s.leaf}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	s.hub, s.hubJS = hub, hub.JetStream()
	seed, _ := s.siteKey.Seed()
	site, err := Open(context.Background(), Config{Name: "site1", StoreDir: t.TempDir(), ClientAddr: testbed.FreeAddr(t), Directory: s.siteDir, Key: s.siteKey,
		Domain: manifest.SiteDomain("site1"), Hub: &Hub{URLs: []string{"nats-leaf://" + s.leaf}, Seed: seed, Deny: manifest.SiteDenied()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { site.Close() })
	s.site, s.siteJS = site, site.JetStream()
	retryUntil(t, 10*time.Second, func() error {
		if !s.hub.Linked() || !s.site.Linked() {
			return fmt.Errorf("not linked: hub %v, site %v", s.hub.Linked(), s.site.Linked())
		}
		return nil
	})
	return s
}

func streamMsgs(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// bodies reads every message of a stream and counts each body.
func bodies(t *testing.T, js jetstream.JetStream, name string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	n := streamMsgs(t, js, name)
	out := map[string]int{}
	for range n {
		m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		out[string(m.Data())]++
	}
	return out
}

// TestLeaf_EventsSourcedOnceAcrossACut: a site's events are stored on the site and sourced
// into the hub's stream, each once: the link's permissions keep event subjects from
// crossing as such, so the hub's stream never captures a site's publish directly (the
// events carry no Nats-Msg-Id here, so a double capture would show), and a hub's event
// never lands on the site. With the hub down the site goes on acking emits; once the hub
// is back, the source catches up and nothing is lost or doubled.
func TestLeaf_EventsSourcedOnceAcrossACut(t *testing.T) {
	s := newSiteBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.siteJS.CreateStream(ctx, jetstream.StreamConfig{Name: manifest.SiteEventsStreamName, Subjects: []string{testEvents}}); err != nil {
		t.Fatal(err)
	}
	sources := []*jetstream.StreamSource{{Name: manifest.SiteEventsStreamName, Domain: manifest.SiteDomain("site1")}}
	if _, err := s.hubJS.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{testEvents}, Sources: sources}); err != nil {
		t.Fatal(err)
	}
	mod, err := nats.Connect(s.site.ClientURL(), nats.Nkey(mustPub(s.moduleKey), s.moduleKey.Sign))
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close()
	modJS, _ := jetstream.New(mod)
	emit := func(js jetstream.JetStream, from, to int, subject string) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, subject, fmt.Appendf(nil, "%s-%d", subject, i)); err != nil {
				t.Fatalf("publish %d on %s: %v", i, subject, err)
			}
		}
	}
	emit(modJS, 0, 50, "mesh.mod.m.event.tick")
	emit(s.hubJS, 0, 10, "mesh.mod.h.event.tick")
	want := func(js jetstream.JetStream, stream string, n uint64) {
		t.Helper()
		retryUntil(t, 30*time.Second, func() error {
			if got := streamMsgs(t, js, stream); got != n {
				return fmt.Errorf("%s holds %d events, want %d", stream, got, n)
			}
			return nil
		})
	}
	want(s.hubJS, "EVENTS", 60)
	want(s.siteJS, manifest.SiteEventsStreamName, 50)

	// The cut: the hub refuses the site's link; the site goes on storing its module's emits.
	if n := s.hub.BarSite(mustPub(s.siteKey), "site1", time.Now().Add(time.Hour)); n != 1 {
		t.Fatalf("cut %d links, want 1", n)
	}
	retryUntil(t, 10*time.Second, func() error {
		if s.site.Linked() {
			return fmt.Errorf("the site is still linked")
		}
		return nil
	})
	emit(modJS, 50, 80, "mesh.mod.m.event.tick")
	s.hub.BarSite(mustPub(s.siteKey), "site1", time.Now())
	t0 := time.Now()
	want(s.hubJS, "EVENTS", 90)
	t.Logf("the hub caught up %v after the bar lifted", time.Since(t0))
	for body, n := range bodies(t, s.hubJS, "EVENTS") {
		if n != 1 {
			t.Fatalf("the hub holds %q %d times", body, n)
		}
	}
	if got := streamMsgs(t, s.siteJS, manifest.SiteEventsStreamName); got != 80 {
		t.Fatalf("the site holds %d events, want its own 80", got)
	}
}

// TestLeaf_KeysKeepTheirKind: a site's key links only as a leafnode, and a client's key
// never links.
func TestLeaf_KeysKeepTheirKind(t *testing.T) {
	s := newSiteBed(t)
	if _, err := nats.Connect(s.hub.ClientURL(), nats.Nkey(mustPub(s.siteKey), s.siteKey.Sign), nats.MaxReconnects(0)); err == nil {
		t.Fatal("a site's key connected to the hub as a client")
	}
	seed, _ := s.moduleKey.Seed()
	s.hubDir.set(s.moduleKey, Identity{Name: "module:m"})
	other, err := Open(context.Background(), Config{Name: "site2", StoreDir: t.TempDir(), ClientAddr: testbed.FreeAddr(t), Directory: s.siteDir, Key: s.siteKey,
		Domain: "site2", Hub: &Hub{URLs: []string{"nats-leaf://" + s.leaf}, Seed: seed}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// Asked twice: the first link was refused, or there would be no second.
	retryUntil(t, 60*time.Second, func() error {
		if n := s.hubDir.timesAsked(s.moduleKey); n < 2 {
			return fmt.Errorf("the hub was asked about the key %d times", n)
		}
		return nil
	})
	if other.Linked() || len(s.hub.Sites()) != 1 {
		t.Fatalf("a client's key linked as a site: sites %v", s.hub.Sites())
	}
}

func mustPub(kp nkeys.KeyPair) string {
	pub, _ := kp.PublicKey()
	return pub
}

// TestLeaf_RegistryMirrored: a site keeps a mirror of a hub's bucket in its own domain; it
// reads it while the link is cut, and catches up with what the hub wrote meanwhile.
func TestLeaf_RegistryMirrored(t *testing.T) {
	s := newSiteBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hubKV, err := s.hubJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "reg", History: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hubKV.Put(ctx, "billing", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	siteKV, err := s.siteJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "reg", Mirror: &jetstream.StreamSource{Name: "reg", Domain: manifest.HubDomain}})
	if err != nil {
		t.Fatal(err)
	}
	read := func(key, want string) {
		t.Helper()
		retryUntil(t, 30*time.Second, func() error {
			e, err := siteKV.Get(ctx, key)
			if err != nil {
				return fmt.Errorf("the site's mirror: %s: %w", key, err)
			}
			if string(e.Value()) != want {
				return fmt.Errorf("the site's mirror: %s is %q, want %q", key, e.Value(), want)
			}
			return nil
		})
	}
	read("billing", "v1")
	s.hub.BarSite(mustPub(s.siteKey), "site1", time.Now().Add(time.Hour))
	retryUntil(t, 10*time.Second, func() error {
		if s.site.Linked() {
			return fmt.Errorf("the site is still linked")
		}
		return nil
	})
	if _, err := hubKV.Put(ctx, "billing", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	read("billing", "v1") // cut off, the site still answers from its mirror
	s.hub.BarSite(mustPub(s.siteKey), "site1", time.Now())
	t0 := time.Now()
	read("billing", "v2")
	t.Logf("the site's mirror caught up %v after the bar lifted", time.Since(t0))
}
