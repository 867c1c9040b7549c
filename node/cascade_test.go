package node_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
)

// newBuilderBed is a node that serves repo as "shop" and runs builds.
func newBuilderBed(t testing.TB, repo *testbed.GitRepo) *bed {
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.GitRepos = map[string]string{"shop": repo.Bare}
	cfg.Builder = true
	return newBedAt(t, cfg)
}

// buildScript is every module's build: an executable that says what it is and what it was
// built on, then waits to be stopped.
const buildScript = `#!/bin/sh
{ echo '#!/bin/sh'; echo "echo $MODULE at $COMMIT on: $(ls "$DEPS" | tr '\n' ' ')"; echo 'exec sleep 600'; } > "$OUT"
`

// notify pokes the node's mesh-git holder, as a post-receive hook does.
func (b *bed) notify(t testing.TB) {
	t.Helper()
	retryUntil(t, 10*time.Second, func() error {
		msg, err := b.op.Request(manifest.NodeToolSubject("alpha", build.GitNotifyTool), []byte(`{"repository":"shop"}`), 5*time.Second)
		if err != nil {
			return err
		}
		if strings.Contains(string(msg.Data), "error") {
			return fmt.Errorf("%s", msg.Data)
		}
		return nil
	})
}

// builds waits until the controller lists want builds finished, and returns them.
func (b *bed) builds(t testing.TB, want int) []api.Build {
	t.Helper()
	var out []api.Build
	retryUntil(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		all, err := admin.Builds(ctx, b.op)
		if err != nil {
			return err
		}
		out = out[:0]
		for _, x := range all {
			if x.Status == "built" || x.Status == "failed" {
				out = append(out, x)
			}
		}
		if len(out) < want || len(all) != len(out) {
			return fmt.Errorf("%d builds finished of %d, want %d: %+v", len(out), len(all), want, all)
		}
		return nil
	})
	return out
}

// TestCascade_ExactlyTheDependents (DESIGN §12): a push builds the modules whose path it
// changed; a new artifact of base rebuilds exactly a and b (built on it), not c, and d (on
// both) once, after both; with deploy --auto the new d runs; a failing build emits failed
// with its log tail and deploys nothing; the audit log chains every event to the push.
func TestCascade_ExactlyTheDependents(t *testing.T) {
	t.Parallel()
	repo := testbed.NewGitRepo(t)
	b := newBuilderBed(t, repo)
	for _, y := range []string{
		"module: base\nbuild: {from: shop/services/base, run: sh build.sh}\n",
		"module: a\nbuild: {from: shop/services/a, run: sh build.sh, on: [base]}\n",
		"module: b\nbuild: {from: shop/services/b, run: sh build.sh, on: [base]}\n",
		"module: c\nbuild: {from: shop/services/c, run: sh build.sh}\n",
		"module: d\nrequires: [mesh-bus]\nbuild: {from: shop/services/d, run: sh build.sh, on: [a, b]}\n",
	} {
		b.register(y)
	}
	files := map[string]string{}
	for _, m := range []string{"base", "a", "b", "c", "d"} {
		files["services/"+m+"/build.sh"] = buildScript
	}
	first := repo.Push(files)
	b.notify(t)
	builds := b.builds(t, 5)
	byModule := func(bs []api.Build) map[string][]api.Build {
		out := map[string][]api.Build{}
		for _, x := range bs {
			out[x.Module] = append(out[x.Module], x)
		}
		return out
	}
	for m, bs := range byModule(builds) {
		if len(bs) != 1 || bs[0].Status != "built" || bs[0].Commit != first {
			t.Fatalf("the first push built %s %d times: %+v", m, len(bs), bs)
		}
	}

	// Deployed with --auto: each new artifact of d runs at once.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dv := byModule(builds)["d"][0].Version
	if _, err := admin.Deploy(ctx, b.op, api.DeployRequest{Module: "d", Deployment: api.Deployment{Version: dv, Nodes: []string{"alpha"}, Instances: 1, Auto: true}}); err != nil {
		t.Fatal(err)
	}
	b.running(t, "d", dv, 0)

	// A push changing only base: base, then exactly a and b, then d once after both.
	second := repo.Push(map[string]string{"services/base/VERSION": "2\n"})
	b.notify(t)
	builds = b.builds(t, 9)[5:]
	got := byModule(builds)
	if len(builds) != 4 || len(got["base"]) != 1 || len(got["a"]) != 1 || len(got["b"]) != 1 || len(got["d"]) != 1 || len(got["c"]) != 0 {
		t.Fatalf("the push of base built %+v, want base, a, b and d once each", builds)
	}
	d := got["d"][0]
	for _, up := range []string{"a", "b"} {
		if d.Started.Before(got[up][0].Finished) {
			t.Fatalf("d was queued at %s, before %s was built at %s", d.Started, up, got[up][0].Finished)
		}
	}
	for _, x := range builds {
		if x.Status != "built" || x.Cascade != builds[0].Cascade {
			t.Fatalf("build %+v: want built, in one cascade", x)
		}
	}
	if got["base"][0].Commit != second {
		t.Fatalf("base built from %s, want %s", got["base"][0].Commit, second)
	}
	p := b.running(t, "d", d.Version, 0)
	if p.Version == dv {
		t.Fatalf("d still runs %s", dv)
	}

	// A push changing only c's path builds c alone (nothing is built on c); while it builds
	// (slowly), builds says it is running.
	repo.Push(map[string]string{"services/c/build.sh": "#!/bin/sh\nsleep 1\n" + strings.TrimPrefix(buildScript, "#!/bin/sh\n")})
	b.notify(t)
	retryUntil(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		all, err := admin.Builds(ctx, b.op)
		if err != nil {
			return err
		}
		if last := all[len(all)-1]; last.Module != "c" || last.Status != "running" {
			return fmt.Errorf("the last build %+v, want c running", last)
		}
		return nil
	})
	if only := b.builds(t, 10)[9:]; len(only) != 1 || only[0].Module != "c" || only[0].Status != "built" {
		t.Fatalf("the push of c built %+v, want c alone", only)
	}

	// A failing build: failed, with its log, and nothing deployed.
	repo.Push(map[string]string{"services/d/build.sh": "#!/bin/sh\necho cannot build d >&2\nexit 3\n"})
	b.notify(t)
	failed := b.builds(t, 11)[10]
	if failed.Module != "d" || failed.Status != "failed" || !strings.Contains(failed.Reason, "exit status 3") {
		t.Fatalf("the failing build: %+v", failed)
	}
	if p := b.running(t, "d", d.Version, 0); p.Version != d.Version {
		t.Fatalf("d runs %s after a failed build, want %s", p.Version, d.Version)
	}

	// The audit log holds the chain: each built event names the event that queued its build,
	// back to the push.
	b.waitAudited(10 * time.Second)
	events := map[string]string{} // event id → its cause
	subjects := map[string]string{}
	for _, source := range []string{build.GitSeat, build.BuilderSeat} {
		for _, r := range b.auditAll(source) {
			if c := r.Headers[envelope.Causation]; len(c) > 0 {
				events[r.EventID] = c[0]
			}
			subjects[r.EventID] = r.Subject
			if !r.Signed || !r.SourceMatches {
				t.Fatalf("audit record %s of %s: signed %v (%s), matches %v", r.EventID, r.Subject, r.Signed, r.SignatureError, r.SourceMatches)
			}
		}
	}
	var chain []string
	var dBuilt string
	for id, s := range subjects {
		if s == manifest.SeatEventSubject(build.BuilderSeat, "built") && events[id] != "" && subjects[events[id]] == manifest.SeatEventSubject(build.BuilderSeat, "built") {
			dBuilt = id // a built event caused by another built event: a rebuild
		}
	}
	var failedLog bool
	for _, r := range b.auditAll(build.BuilderSeat) {
		failedLog = failedLog || r.Subject == manifest.SeatEventSubject(build.BuilderSeat, "failed") && strings.Contains(string(r.Body), "cannot build d")
	}
	if !failedLog {
		t.Fatal("no failed event carries the failing build's log tail")
	}
	if dBuilt == "" {
		t.Fatal("no rebuild in the audit log names the built event that caused it")
	}
	for id := dBuilt; id != ""; id = events[id] {
		chain = append(chain, subjects[id])
		if len(chain) > 10 {
			break
		}
	}
	if last := chain[len(chain)-1]; last != manifest.SeatEventSubject(build.GitSeat, "pushed") {
		t.Fatalf("the causation chain %v does not end at the push", chain)
	}
}

// TestCascade_SharedPath: a push builds every module built from a path it changed — two
// built from the same path both — and none built from a path it did not touch.
func TestCascade_SharedPath(t *testing.T) {
	t.Parallel()
	repo := testbed.NewGitRepo(t)
	b := newBuilderBed(t, repo)
	for _, y := range []string{
		"module: p\nbuild: {from: shop/svc/p, run: sh build.sh}\n",
		"module: p-debug\nbuild: {from: shop/svc/p, run: sh build.sh}\n",
		"module: q\nbuild: {from: shop/svc/q, run: sh build.sh}\n",
	} {
		b.register(y)
	}
	repo.Push(map[string]string{"svc/p/build.sh": buildScript, "svc/q/build.sh": buildScript})
	b.notify(t)
	b.builds(t, 3)
	repo.Push(map[string]string{"svc/p/lib.txt": "shared by p and p-debug\n"})
	b.notify(t)
	var got []string
	for _, x := range b.builds(t, 5)[3:] {
		got = append(got, x.Module)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"p", "p-debug"}) {
		t.Fatalf("the push of svc/p built %v, want p and p-debug", got)
	}
}
