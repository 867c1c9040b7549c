package provision_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/provision"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nkeys"
)

func parse(t *testing.T, y string) *manifest.Manifest {
	t.Helper()
	m, err := manifest.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func provider(name, iface string) string {
	return "module: " + name + "\nrequires: [mesh-bus]\nseats:\n  " + name + ":\n    scope: mesh\n    serves: [create, remove, holds]\n    provides: [" + iface + "]\n"
}

// TestResolve: kv is the mesh's; one provider is taken; several need a choice, which must be
// one of them; none waits, saying what to register.
func TestResolve(t *testing.T) {
	a, b := parse(t, provider("pg-a", "postgres")), parse(t, provider("pg-b", "postgres"))
	app := parse(t, "module: app\nrequires: [mesh-bus, kv, postgres: {connection-limit: 5}, redis]\n")
	got := provision.Resolve(app, []*manifest.Manifest{a}, nil)
	want := []provision.Want{
		{Consumer: "app", Interface: "kv", Provider: provision.MeshProvider},
		{Consumer: "app", Interface: "postgres", Provider: "pg-a", Options: map[string]string{"connection-limit": "5"}},
		{Consumer: "app", Interface: "redis", Problem: "no seat provides redis yet: register a module whose seat has provides: [redis]"},
	}
	if !slices.EqualFunc(got, want, func(a, b provision.Want) bool {
		return a.Consumer == b.Consumer && a.Interface == b.Interface && a.Provider == b.Provider && a.Problem == b.Problem && maps.Equal(a.Options, b.Options)
	}) {
		t.Fatalf("resolve %+v\nwant %+v", got, want)
	}
	two := provision.Resolve(app, []*manifest.Manifest{a, b}, nil)[1]
	if two.Provider != "" || !strings.Contains(two.Problem, "seats pg-a, pg-b all provide postgres: choose one with `meshnode provisions pin app postgres SEAT`") {
		t.Fatalf("two providers, no choice: %+v", two)
	}
	if w := provision.Resolve(app, []*manifest.Manifest{a, b}, map[string]string{"postgres": "pg-b"})[1]; w.Provider != "pg-b" || w.Problem != "" {
		t.Fatalf("chosen: %+v", w)
	}
	if w := provision.Resolve(app, []*manifest.Manifest{a, b}, map[string]string{"postgres": "pg-c"})[1]; w.Provider != "" || !strings.Contains(w.Problem, "pg-c does not provide postgres (pg-a, pg-b do)") {
		t.Fatalf("a choice that does not provide it: %+v", w)
	}
}

// memStore is a Store in memory.
type memStore struct {
	mu sync.Mutex
	m  map[string]api.Provision
}

func (s *memStore) All(context.Context) (map[string]api.Provision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.m), nil
}
func (s *memStore) Put(_ context.Context, r api.Provision) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[provision.Key(r.Consumer, r.Interface)] = r
	return nil
}
func (s *memStore) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
	return nil
}

// fakeProvider holds resources in memory; down makes it unavailable, refuse makes create fail.
type fakeProvider struct {
	held    map[string]bool
	down    bool
	refuse  error
	creates int
	options map[string]map[string]string // the options of each consumer's last create
}

func (p *fakeProvider) Create(_ context.Context, req api.ProvisionCreateRequest) (api.ProvisionCreateReply, error) {
	switch {
	case p.down:
		return api.ProvisionCreateReply{}, provision.ErrUnavailable
	case p.refuse != nil:
		return api.ProvisionCreateReply{}, p.refuse
	}
	p.held[req.Consumer] = true
	p.creates++
	if p.options == nil {
		p.options = map[string]map[string]string{}
	}
	p.options[req.Consumer] = req.Options
	return provision.Seal(api.Provisioned{Env: map[string]string{"POSTGRES_URL": "postgres://" + req.Consumer}}, req)
}
func (p *fakeProvider) Remove(_ context.Context, req api.ProvisionRemoveRequest) error {
	if p.down {
		return provision.ErrUnavailable
	}
	delete(p.held, req.Consumer)
	return nil
}
func (p *fakeProvider) Holds(context.Context, string) ([]string, error) {
	if p.down {
		return nil, provision.ErrUnavailable
	}
	return slices.Sorted(maps.Keys(p.held)), nil
}

type rig struct {
	r      *provision.Reconciler
	store  *memStore
	pg     *fakeProvider
	kept   map[string]api.Provisioned // by consumer, opened as the vault would
	events []string
}

func newRig(t *testing.T) *rig {
	intake, _ := nkeys.CreateCurveKeys()
	pub, _ := intake.PublicKey()
	g := &rig{store: &memStore{m: map[string]api.Provision{}}, pg: &fakeProvider{held: map[string]bool{}}, kept: map[string]api.Provisioned{}}
	g.r = &provision.Reconciler{
		Store:     g.store,
		Provider:  func(string) provision.Provider { return g.pg },
		IntakeKey: func(context.Context) (string, error) { return pub, nil },
		Keep: func(_ context.Context, consumer, iface string, reply api.ProvisionCreateReply) error {
			plain, err := vault.Unseal(intake, reply.Sender, reply.Sealed)
			if err != nil {
				return err
			}
			g.kept[consumer] = api.Provisioned{Env: map[string]string{"raw": string(plain)}}
			return nil
		},
		Drop: func(_ context.Context, consumer, _ string) error { delete(g.kept, consumer); return nil },
		Event: func(_ context.Context, action string, meta map[string]any) {
			g.events = append(g.events, action+" "+meta["consumer"].(string))
		},
		RetryFailed: time.Hour,
	}
	return g
}

func (g *rig) pass(t *testing.T, wants []provision.Want, holds bool) provision.Result {
	t.Helper()
	res, err := g.r.Pass(context.Background(), wants, holds)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (g *rig) state(key string) api.Provision {
	all, _ := g.store.All(context.Background())
	return all[key]
}

// TestReconciler: waiting while the provider is away; created (its credential kept sealed
// through) when it answers; a failed create waits RetryFailed; holds re-creates what the
// provider lost and removes orphans; a provision nobody wants is removed and forgotten.
func TestReconciler(t *testing.T) {
	g := newRig(t)
	want := []provision.Want{{Consumer: "app", Interface: "postgres", Provider: "pg"}}
	g.pg.down = true
	if res := g.pass(t, want, false); !res.Pending || len(res.Changed) != 0 {
		t.Fatalf("provider down: %+v", res)
	}
	if r := g.state("app.postgres"); r.State != provision.StateWaiting || r.Provider != "pg" {
		t.Fatalf("provider down: %+v", r)
	}
	g.pg.down = false
	if res := g.pass(t, want, false); res.Pending || !slices.Equal(res.Changed, []string{"app"}) {
		t.Fatalf("provider up: %+v", res)
	}
	if r := g.state("app.postgres"); r.State != provision.StateReady || r.Generation != 1 {
		t.Fatalf("provider up: %+v", r)
	}
	if !strings.Contains(g.kept["app"].Env["raw"], "postgres://app") {
		t.Fatalf("the vault kept %v", g.kept)
	}
	// Nothing to do: nothing is created again.
	g.pass(t, want, true)
	if g.pg.creates != 1 {
		t.Fatalf("%d creates, want 1", g.pg.creates)
	}
	// Lost behind its back, and an orphan beside it.
	delete(g.pg.held, "app")
	g.pg.held["ghost"] = true
	g.pass(t, want, false)
	if g.pg.creates != 1 {
		t.Fatal("re-created without a holds pass")
	}
	if res := g.pass(t, want, true); !slices.Equal(res.Changed, []string{"app"}) {
		t.Fatalf("holds pass: %+v", res)
	}
	if r := g.state("app.postgres"); r.Generation != 2 || !g.pg.held["app"] || g.pg.held["ghost"] {
		t.Fatalf("after holds: %+v held %v", r, g.pg.held)
	}
	// A failed create is tried again only after RetryFailed.
	g2 := newRig(t)
	g2.pg.refuse = errors.New("disk full")
	g2.pass(t, want, false)
	g2.pass(t, want, false)
	if r := g2.state("app.postgres"); r.State != provision.StateFailed || !strings.Contains(r.Reason, "disk full") {
		t.Fatalf("failed: %+v", r)
	}
	if n := slices.Index(g2.events, "provision-failed app"); n < 0 || slices.Index(g2.events[n+1:], "provision-failed app") >= 0 {
		t.Fatalf("events %v, want one provision-failed", g2.events)
	}
	// Nobody wants it: removed at the provider, dropped from the vault, forgotten.
	if res := g.pass(t, nil, false); !slices.Equal(res.Changed, []string{"app"}) {
		t.Fatalf("unwanted: %+v", res)
	}
	if _, ok := g.kept["app"]; ok || g.pg.held["app"] || g.state("app.postgres").Consumer != "" {
		t.Fatalf("after removal: kept %v held %v", g.kept, g.pg.held)
	}
	wantEvents := []string{"provisioned app", "provisioned app", "deprovisioned ghost", "deprovisioned app"}
	if !slices.Equal(g.events, wantEvents) {
		t.Fatalf("events %v, want %v", g.events, wantEvents)
	}
}

// TestReconciler_Options: the provider's create receives the requirement's options; the same
// options create nothing again, other options create the resource again (a new generation,
// an event saying why).
func TestReconciler_Options(t *testing.T) {
	g := newRig(t)
	want := []provision.Want{{Consumer: "app", Interface: "postgres", Provider: "pg", Options: map[string]string{"connection-limit": "5"}}}
	g.pass(t, want, false)
	if got := g.pg.options["app"]; got["connection-limit"] != "5" || len(got) != 1 {
		t.Fatalf("the provider's create got options %v", got)
	}
	if r := g.state("app.postgres"); r.Generation != 1 || r.Options["connection-limit"] != "5" {
		t.Fatalf("record %+v", r)
	}
	g.pass(t, want, true)
	if g.pg.creates != 1 {
		t.Fatalf("%d creates with the same options, want 1", g.pg.creates)
	}
	want[0].Options = map[string]string{"connection-limit": "9"}
	if res := g.pass(t, want, false); !slices.Equal(res.Changed, []string{"app"}) {
		t.Fatalf("options changed: %+v", res)
	}
	if r := g.state("app.postgres"); g.pg.creates != 2 || r.Generation != 2 || r.Options["connection-limit"] != "9" || g.pg.options["app"]["connection-limit"] != "9" {
		t.Fatalf("after the change: %d creates, record %+v", g.pg.creates, r)
	}
	want[0].Options = nil
	g.pass(t, want, false)
	if r := g.state("app.postgres"); g.pg.creates != 3 || r.Options != nil {
		t.Fatalf("options dropped: %d creates, record %+v", g.pg.creates, r)
	}
}

// TestCredentialCheck: a provider names only its interface's variables.
func TestCredentialCheck(t *testing.T) {
	for _, tc := range []struct {
		env map[string]string
		ok  bool
	}{
		{map[string]string{"POSTGRES_URL": "x"}, true},
		{map[string]string{"MY_DB_URL": "x"}, false},
		{map[string]string{"POSTGRES_DB_URL": "x"}, false},
		{map[string]string{"PATH": "/tmp"}, false},
		{map[string]string{"POSTGRES_": "x"}, false},
		{map[string]string{"POSTGRES_url": "x"}, false},
		{map[string]string{"POSTGRES_PRELOAD": "x"}, false},
		{map[string]string{"POSTGRES_HOST": "h", "POSTGRES_PORT": "1", "POSTGRES_USER": "u", "POSTGRES_PASSWORD": "p", "POSTGRES_DATABASE": "d"}, true},
		{map[string]string{"POSTGRES_URL": strings.Repeat("x", 5000)}, false},
		{nil, false},
	} {
		if err := (api.Provisioned{Env: tc.env}).Check("postgres"); (err == nil) != tc.ok {
			t.Errorf("%v: %v, want ok=%v", tc.env, err, tc.ok)
		}
	}
	if api.EnvPrefix("my-db") != "MY_DB_" {
		t.Fatal(api.EnvPrefix("my-db"))
	}
}
