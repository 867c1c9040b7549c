package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/provision"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// provisions returns the controller's provision rows, by consumer and interface.
func (b *bed) provisions(t testing.TB) map[string]api.Provision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs, err := admin.Provisions(ctx, b.op)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]api.Provision{}
	for _, r := range rs {
		out[provision.Key(r.Consumer, r.Interface)] = r
	}
	return out
}

// controllerEvents returns the controller's provisioning events stored on EVENTS, in order.
func (b *bed) controllerEvents(t testing.TB, action string) []map[string]any {
	t.Helper()
	var out []map[string]any
	b.eachMessage(t, manifest.EventsStreamName, manifest.SeatEventSubject(manifest.ControllerSeat, action), func(m jetstream.Msg) {
		var meta map[string]any
		json.Unmarshal(m.Data(), &meta)
		out = append(out, meta)
	})
	return out
}

// TestProvision_KV: a module that requires kv is given a bucket of its own before it
// starts, reads and writes it with its bus identity, and is refused another module's; a
// bucket lost behind the mesh's back is created again within one reconcile period, with an
// event saying so; undeployed, its bucket is removed, with an event.
func TestProvision_KV(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.ProvisionInterval = config.Duration(time.Second)
	b := newBedAt(t, cfg)
	storeSeed, _ := b.register("module: store\nrequires: [mesh-bus, kv]\n")
	b.register("module: other\nrequires: [mesh-bus, kv]\n")
	plainSeed, _ := b.register("module: plain\nrequires: [mesh-bus]\n")
	for _, m := range []string{"store", "other"} {
		b.putArtifact(m, "1", fmt.Sprintf(sleeper, "1"))
		b.deploy(m, "1")
	}
	retryUntil(t, 20*time.Second, func() error {
		ps := b.provisions(t)
		for _, m := range []string{"store", "other"} {
			if r := ps[provision.Key(m, "kv")]; r.State != provision.StateReady || r.Provider != provision.MeshProvider || r.Generation != 1 {
				return fmt.Errorf("%s: %+v", m, r)
			}
		}
		return nil
	})
	b.running(t, "store", "1", 0)

	// The module's own bucket, through the sdk and with its raw connection.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := b.client(storeSeed)
	kv, err := c.KV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "greeting", []byte("hello")); err != nil {
		t.Fatalf("put into its own bucket: %v", err)
	}
	if e, err := kv.Get(ctx, "greeting"); err != nil || string(e.Value()) != "hello" {
		t.Fatalf("get from its own bucket: %v", err)
	}
	if err := kv.Delete(ctx, "greeting"); err != nil {
		t.Fatalf("delete from its own bucket: %v", err)
	}
	// No consumer, even on its own bucket: a consumer's delivery subject is in the request's
	// body, beyond every subject permission, and could aim its messages at any tool.
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	if _, err := kv.ListKeys(short); err == nil {
		t.Fatal("store listed keys: a consumer was created")
	}
	cancelShort()
	// Another module's bucket is refused, whichever way it is asked.
	// (A refused request is a permission violation the client hears only as a timeout.)
	js, _ := jetstream.New(c.Conn())
	short, cancelShort = context.WithTimeout(ctx, 2*time.Second)
	if _, err := js.KeyValue(short, manifest.KVBucket("other")); err == nil {
		t.Fatal("store opened other's bucket")
	}
	cancelShort()
	short, cancelShort = context.WithTimeout(ctx, 2*time.Second)
	if _, err := js.Publish(short, "$KV."+manifest.KVBucket("other")+".x", []byte("intrusion")); err == nil {
		t.Fatal("store wrote into other's bucket")
	}
	cancelShort()
	otherKV, err := b.js.KeyValue(ctx, manifest.KVBucket("other"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otherKV.Get(ctx, "x"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("other's bucket holds x: %v", err)
	}
	// A module that does not require kv has no bucket, and the sdk says why.
	if _, err := b.client(plainSeed).KV(ctx); err == nil {
		t.Fatal("a module without requires: [kv] got a bucket")
	}

	// Lost behind the mesh's back: created again within a reconcile period, with an event;
	// a bucket nobody requires (an orphan) is removed.
	if err := b.js.DeleteKeyValue(ctx, manifest.KVBucket("other")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: manifest.KVBucket("ghost")}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if r := b.provisions(t)[provision.Key("other", "kv")]; r.Generation != 2 || r.State != provision.StateReady {
			return fmt.Errorf("other's kv %+v", r)
		}
		if _, err := b.js.KeyValue(ctx, manifest.KVBucket("other")); err != nil {
			return err
		}
		return nil
	})
	// The events follow what they report (the reconciler publishes after it acts).
	retryUntil(t, 10*time.Second, func() error {
		if _, err := b.js.KeyValue(ctx, manifest.KVBucket("ghost")); !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("the orphan bucket: %v", err)
		}
		if evs := b.controllerEvents(t, "deprovisioned"); !slices.ContainsFunc(evs, func(m map[string]any) bool {
			return m["consumer"] == "ghost" && strings.HasPrefix(m["reason"].(string), "an orphan")
		}) {
			return fmt.Errorf("no deprovisioned event for the orphan: %v", evs)
		}
		if evs := b.controllerEvents(t, "provisioned"); !slices.ContainsFunc(evs, func(m map[string]any) bool {
			return m["consumer"] == "other" && m["interface"] == "kv" && m["reason"] == "re-created: the provider no longer held it"
		}) {
			return fmt.Errorf("no provisioned event says other's kv was re-created: %v", evs)
		}
		return nil
	})

	// Undeployed: the bucket is gone, and an event says so.
	if _, err := admin.Undeploy(ctx, b.op, api.UndeployRequest{Module: "store"}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if _, ok := b.provisions(t)[provision.Key("store", "kv")]; ok {
			return errors.New("store's kv still listed")
		}
		if _, err := b.js.KeyValue(ctx, manifest.KVBucket("store")); !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("store's bucket: %v", err)
		}
		if evs := b.controllerEvents(t, "deprovisioned"); !slices.ContainsFunc(evs, func(m map[string]any) bool {
			return m["consumer"] == "store" && m["interface"] == "kv"
		}) {
			return fmt.Errorf("no deprovisioned event for store's kv: %v", evs)
		}
		return nil
	})
	// What the mesh said of all this — registrations, deployments, provisions, the node's
	// own events — is genuine, and found by the names the audit verbs print.
	b.auditTruthful(t)
}

// TestProvision_WaitsForProvider: a module whose required interface nobody provides is
// declared waiting and not started (ps says on what); `provisions` says why. A module whose
// seat has no holder starts all the same: seats are soft dependencies.
func TestProvision_WaitsForProvider(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: mail\nrequires: [mesh-bus]\nseats:\n  mailer:\n    scope: mesh\n    retain: 1h\n    accepts: [send]\n")
	b.register("module: user\nrequires: [mesh-bus]\nuses: [mailer]\n")
	b.putArtifact("user", "1", fmt.Sprintf(sleeper, "1"))
	b.deploy("user", "1")
	b.register("module: app\nrequires: [mesh-bus, redis]\n")
	b.putArtifact("app", "1", fmt.Sprintf(sleeper, "1"))
	b.deploy("app", "1")
	retryUntil(t, 10*time.Second, func() error {
		ps := b.ps("app")
		if len(ps) != 1 || ps[0].State != host.StateWaiting || ps[0].Reason != "waiting on redis from a provider" || ps[0].PID != 0 {
			return fmt.Errorf("ps %+v", ps)
		}
		return nil
	})
	r := b.provisions(t)[provision.Key("app", "redis")]
	if r.State != provision.StateWaiting || r.Reason != "no seat provides redis yet: register a module whose seat has provides: [redis]" {
		t.Fatalf("provision %+v", r)
	}
	b.running(t, "user", "1", 0)
}

// streamsHolding returns where any of needles occurs in a message (body or headers) of any
// stream of the mesh: STATE, EVENTS, every key-value bucket and object store.
func (b *bed) streamsHolding(t testing.TB, needles ...[]byte) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var found []string
	names := b.js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := b.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().State.Msgs == 0 {
			continue // nothing to read (and a work queue's consumer must ack)
		}
		b.eachMessage(t, name, "", func(m jetstream.Msg) {
			hdr := fmt.Sprint(m.Headers())
			for _, needle := range needles {
				if bytes.Contains(m.Data(), needle) || strings.Contains(hdr, string(needle)) {
					found = append(found, name+" "+m.Subject())
				}
			}
		})
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return found
}

// filesHolding returns the files under dir that contain needle, but for those except allows.
func filesHolding(t testing.TB, dir string, needle []byte, except func(path string) bool) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || except(path) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, needle) {
			found = append(found, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestVault_GivenValue: the operator gives a secret its value (sealed to the vault's intake
// key on the way); the module fetches it; the value is in no stream and no file of the
// data dir; a value sealed to another key is refused.
func TestVault_GivenValue(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	_, reg := b.register("module: shop\nrequires: [mesh-bus]\nsecrets: [admin-url]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	value := []byte("postgres://admin:" + strings.Repeat("s3cr3t", 4) + "@127.0.0.1:5432/postgres")
	req := api.VaultRequest{Owner: "shop", Name: "admin-url"}
	if err := vault.Give(ctx, b.op, api.VaultCallerOperator, &req, value); err != nil {
		t.Fatal(err)
	}
	var s api.Secret
	if _, err := b.vault(api.VaultVerbMint, req, &s); err != nil || s.Value != string(value) {
		t.Fatalf("mint with a given value: %q %v", s.Value, err)
	}
	if _, err := b.vault(api.VaultVerbFetch, api.VaultRequest{Owner: "shop", Name: "admin-url"}, &s); err != nil || s.Value != string(value) {
		t.Fatalf("fetch: %q %v", s.Value, err)
	}
	other, _ := nkeys.CreateCurveKeys()
	otherPub, _ := other.PublicKey()
	sealed, sender, _ := vault.Seal(otherPub, []byte("x"))
	if _, err := b.vault(api.VaultVerbRotate, api.VaultRequest{Owner: "shop", Name: "admin-url", Sealed: sealed, Sender: sender}, &s); err == nil || !strings.Contains(err.Error(), "intake key") {
		t.Fatalf("a value sealed to another key: %v", err)
	}
	if got := b.streamsHolding(t, value); len(got) > 0 {
		t.Fatalf("the value is in streams: %v", got)
	}
	// The scans can see: the module's public key is in the registry's stream, on disk.
	if len(b.streamsHolding(t, []byte(reg.PublicKey))) == 0 || len(filesHolding(t, b.dir, []byte(reg.PublicKey), func(string) bool { return false })) == 0 {
		t.Fatal("the scans find not even the module's public key")
	}
	if got := filesHolding(t, b.dir, value, func(string) bool { return false }); len(got) > 0 {
		t.Fatalf("the value is in files: %v", got)
	}
	if got := filesHolding(t, b.dir, []byte("s3cr3ts3cr3t"), func(string) bool { return false }); len(got) > 0 {
		t.Fatalf("part of the value is in files: %v", got)
	}
}

// memProvider is a provisioner written with the sdk, keeping its resources in memory: what
// it holds, and how often each tool was called.
type memProvider struct {
	mu      sync.Mutex
	held    map[string]bool
	creates int
}

func (p *memProvider) handlers(iface string) sdk.SeatHandlers {
	return sdk.SeatHandlers{Serves: map[string]sdk.ToolHandler{
		"create": func(_ context.Context, r sdk.Request) ([]byte, error) {
			var req api.ProvisionCreateRequest
			if err := json.Unmarshal(r.Data, &req); err != nil {
				return nil, err
			}
			p.mu.Lock()
			p.held[req.Consumer] = true
			p.creates++
			p.mu.Unlock()
			reply, err := provision.Seal(api.Provisioned{Env: map[string]string{
				api.EnvPrefix(iface) + "URL": "cache://" + req.Consumer + ":pw-" + req.Consumer + "@127.0.0.1/"}}, req)
			if err != nil {
				return nil, err
			}
			return json.Marshal(reply)
		},
		"remove": func(_ context.Context, r sdk.Request) ([]byte, error) {
			var req api.ProvisionRemoveRequest
			json.Unmarshal(r.Data, &req)
			p.mu.Lock()
			delete(p.held, req.Consumer)
			p.mu.Unlock()
			return []byte("{}"), nil
		},
		"holds": func(context.Context, sdk.Request) ([]byte, error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			return json.Marshal(api.ProvisionHoldsReply{Consumers: slices.Sorted(maps.Keys(p.held))})
		},
	}}
}

func (p *memProvider) holding() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.held))
}

// TestProvision_ChooseAmongProviders: with two seats providing one interface, a consumer
// waits until the operator chooses one; it then waits on that seat's holder, not started;
// once a holder answers it starts with the credential in its environment. Removing the
// consumer removes its resource at the provider.
func TestProvision_ChooseAmongProviders(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedA, _ := b.register("module: cache-a\nrequires: [mesh-bus]\nseats:\n  cache-a:\n    scope: mesh\n    serves: [create, remove, holds]\n    provides: [cache]\n")
	b.register("module: cache-b\nrequires: [mesh-bus]\nseats:\n  cache-b:\n    scope: mesh\n    serves: [create, remove, holds]\n    provides: [cache]\n")
	b.register("module: app\nrequires: [mesh-bus, cache]\n")
	b.putArtifact("app", "1", "#!/bin/sh\necho \"url=$CACHE_URL\"\nexec sleep 600\n")
	b.deploy("app", "1")
	retryUntil(t, 10*time.Second, func() error {
		r := b.provisions(t)[provision.Key("app", "cache")]
		if r.State != provision.StateWaiting || !strings.Contains(r.Reason, "seats cache-a, cache-b all provide cache: choose one with `meshnode provisions pin app cache SEAT`") {
			return fmt.Errorf("provision %+v", r)
		}
		if ps := b.ps("app"); len(ps) != 1 || ps[0].Reason != "waiting on cache from a provider" {
			return fmt.Errorf("ps %+v", ps)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.Provide(ctx, b.op, api.ProvideRequest{Module: "app", Interface: "cache", Provider: "cache-c"}); err == nil || !strings.Contains(err.Error(), "does not provide cache") {
		t.Fatalf("choosing a seat that does not provide it: %v", err)
	}
	if _, err := admin.Provide(ctx, b.op, api.ProvideRequest{Module: "app", Interface: "cache", Provider: "cache-a"}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		r := b.provisions(t)[provision.Key("app", "cache")]
		if r.State != provision.StateWaiting || r.Provider != "cache-a" || !strings.Contains(r.Reason, "no holder of seat cache-a answers") {
			return fmt.Errorf("provision %+v", r)
		}
		if ps := b.ps("app"); len(ps) != 1 || ps[0].Reason != "waiting on cache from cache-a" || ps[0].PID != 0 {
			return fmt.Errorf("ps %+v", ps)
		}
		return nil
	})
	p := &memProvider{held: map[string]bool{}}
	if err := b.client(seedA).HoldSeat("cache-a", p.handlers("cache")); err != nil {
		t.Fatal(err)
	}
	b.running(t, "app", "1", 0)
	retryUntil(t, 10*time.Second, func() error {
		out, err := os.ReadFile(filepath.Join(b.dir, "modules", "app", "output.log"))
		if err != nil || !strings.Contains(string(out), "url=cache://app:pw-app@127.0.0.1/") {
			return fmt.Errorf("output %q %v", out, err)
		}
		return nil
	})
	if got := p.holding(); !slices.Equal(got, []string{"app"}) {
		t.Fatalf("the provider holds %v", got)
	}
	if got := b.streamsHolding(t, []byte("pw-app")); len(got) > 0 {
		t.Fatalf("the credential is in streams: %v", got)
	}
	if _, err := admin.Remove(ctx, b.op, api.RemoveRequest{Module: "app"}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if got := p.holding(); len(got) > 0 {
			return fmt.Errorf("the provider still holds %v", got)
		}
		if evs := b.controllerEvents(t, "deprovisioned"); !slices.ContainsFunc(evs, func(m map[string]any) bool {
			return m["consumer"] == "app" && m["interface"] == "cache" && m["provider"] == "cache-a"
		}) {
			return fmt.Errorf("no deprovisioned event for the removed app: %v", evs)
		}
		return nil
	})
}

// TestProvision_RestartKeepsConsumersRunning: a controller that starts (here: its node
// restarts) declares its consumers from the provisions it reads first — not waiting, which
// would stop them until the next reconcile period: the declaration stays the one before.
func TestProvision_RestartKeepsConsumersRunning(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "alpha")
	b := newBedAt(t, cfg)
	b.register("module: store\nrequires: [mesh-bus, kv]\n")
	b.putArtifact("store", "1", fmt.Sprintf(sleeper, "1"))
	b.deploy("store", "1")
	before := b.running(t, "store", "1", 0).Declared
	b.close()
	b = newBedAt(t, cfg)
	retryUntil(t, 10*time.Second, func() error {
		ps := b.ps("store") // rows once the new holder has declared
		if len(ps) != 1 || ps[0].State != host.StateRunning || ps[0].Revision != ps[0].Declared {
			return fmt.Errorf("ps after the restart %+v", ps)
		}
		if ps[0].Declared != before {
			t.Fatalf("the restarted controller declared revision %d (was %d): it changed what store runs with", ps[0].Declared, before)
		}
		return nil
	})
}
