//go:build integration

package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/audit"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// cluster is three running in-process nodes, any of which can be stopped and started again.
type cluster struct {
	t     testing.TB
	cfgs  []config.Config
	nodes []*node.Node
	stops []func()
	op    *nats.Conn // the operator, on node a
	js    jetstream.JetStream
}

func newCluster(t testing.TB) *cluster { return newClusterWith(t, nil) }

// newClusterWith is newCluster with each node's configuration changed by tweak first.
func newClusterWith(t testing.TB, tweak func(i int, c *config.Config)) *cluster {
	cfgs, nodes := openThreeWith(t, tweak)
	c := &cluster{t: t, cfgs: cfgs, nodes: nodes, stops: make([]func(), 3)}
	for i := range nodes {
		c.run(i)
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			c.stop(i)
		}
	})
	c.op = connect(t, nodes[0].ClientURL(), filepath.Join(cfgs[0].DataDir, datadir.OperatorSeedFile))
	t.Cleanup(c.op.Close)
	c.js, _ = jetstream.New(c.op)
	return c
}

func (c *cluster) run(i int) {
	ctx, cancel := context.WithCancel(context.Background())
	var done sync.WaitGroup
	done.Add(1)
	go func() {
		defer done.Done()
		c.nodes[i].Run(ctx)
	}()
	c.stops[i] = func() { cancel(); done.Wait(); c.nodes[i].Close() }
}

// stop stops node i (its modules with it).
func (c *cluster) stop(i int) {
	if c.stops[i] != nil {
		c.stops[i]()
		c.stops[i] = nil
	}
}

// start opens node i again on its data dir and runs it.
func (c *cluster) start(i int) {
	n := node.New(c.cfgs[i], testLog())
	if err := n.Open(); err != nil {
		c.t.Fatalf("reopen %s: %v", c.cfgs[i].Name, err)
	}
	c.nodes[i] = n
	c.run(i)
}

func (c *cluster) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c.t.Cleanup(cancel)
	return ctx
}

func (c *cluster) putArtifact(module, version, path string) {
	c.t.Helper()
	var obs jetstream.ObjectStore
	retryUntil(c.t, 20*time.Second, func() (err error) {
		obs, err = artifact.Lookup(c.ctx(), c.js)
		return err
	})
	if _, err := artifact.Put(c.ctx(), obs, module, version, path); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) deploy(module, version string, nodes ...string) {
	c.t.Helper()
	retryUntil(c.t, 20*time.Second, func() error {
		_, err := admin.Deploy(c.ctx(), c.op, api.DeployRequest{Module: module, Deployment: api.Deployment{Version: version, Nodes: nodes, Instances: 1}})
		return err
	})
}

func (c *cluster) ps(module string) []api.Process {
	c.t.Helper()
	all, err := admin.Ps(c.ctx(), c.op)
	if err != nil {
		c.t.Fatal(err)
	}
	var out []api.Process
	for _, p := range all {
		if p.Module == module {
			out = append(out, p)
		}
	}
	return out
}

// TestIntegration_DeployOnTwoOfThree: an example module built from Go runs on two of three
// nodes; its signed events reach a consumer; a process killed with -9 is restarted; undeployed,
// it stops everywhere and its credentials leave both nodes.
func TestIntegration_DeployOnTwoOfThree(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ticker")
	build := exec.Command("go", "build", "-o", bin, "../examples/ticker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the example: %v\n%s", err, out)
	}
	c := newCluster(t)
	retryUntil(t, 20*time.Second, func() error {
		_, err := admin.Register(c.ctx(), c.op, []byte("module: ticker\nrequires: [mesh-bus]\nemits: [tick]\n"))
		return err
	})
	watcher, err := admin.Register(c.ctx(), c.op, []byte("module: watcher\nrequires: [mesh-bus]\nconsumes: [ticker.tick]\n"))
	if err != nil {
		t.Fatal(err)
	}
	c.putArtifact("ticker", "1", bin)
	c.deploy("ticker", "1", "a", "b")

	seed := filepath.Join(t.TempDir(), "watcher.nk")
	os.WriteFile(seed, watcher.Seed, 0o600)
	w, err := sdk.Connect(c.ctx(), c.nodes[2].ClientURL(), seed)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var mu sync.Mutex
	from := map[string]bool{}
	if err := w.On("ticker.tick", func(_ context.Context, e sdk.Event) error {
		mu.Lock()
		from[e.Node] = true
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !from["a"] || !from["b"] || from["c"] {
			return fmt.Errorf("signed ticks heard from %v, want a and b", from)
		}
		return nil
	})
	var onA api.Process
	retryUntil(t, 10*time.Second, func() error {
		ps := c.ps("ticker")
		if len(ps) != 2 {
			return fmt.Errorf("ps %+v", ps)
		}
		for _, p := range ps {
			if p.State != host.StateRunning || p.PID == 0 {
				return fmt.Errorf("ps %+v", ps)
			}
			if p.Node == "a" {
				onA = p
			}
		}
		return nil
	})
	if err := syscall.Kill(onA.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		for _, p := range c.ps("ticker") {
			if p.Node == "a" && (p.PID == onA.PID || p.State != host.StateRunning || p.Restarts < 1) {
				return fmt.Errorf("on a: %+v", p)
			}
		}
		return nil
	})

	if _, err := admin.Undeploy(c.ctx(), c.op, api.UndeployRequest{Module: "ticker"}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 30*time.Second, func() error {
		if ps := c.ps("ticker"); len(ps) > 0 {
			return fmt.Errorf("ps %+v", ps)
		}
		for _, cfg := range c.cfgs[:2] {
			if _, err := os.Stat(filepath.Join(cfg.DataDir, "modules", "ticker", "creds.nk")); err == nil {
				return fmt.Errorf("credentials still on %s", cfg.Name)
			}
		}
		return nil
	})
	c.auditGenuine()
}

// auditGenuine checks that every running node's audit log flags nothing: the events the
// mesh published about what the bed did — registrations, deployments, processes, seats —
// are genuine on every node.
func (c *cluster) auditGenuine() {
	c.t.Helper()
	for i, n := range c.nodes {
		if n == nil || c.stops[i] == nil {
			continue
		}
		name := n.Identity().Name
		retryUntil(c.t, 30*time.Second, func() error {
			reply, err := audit.Call(c.ctx(), c.op, name, api.AuditRequest{Op: "verify"})
			if err != nil {
				return err
			}
			if v := reply.Verification; v == nil || v.Broken != nil || v.FlaggedTotal != 0 {
				return fmt.Errorf("audit verify on %s: %+v", name, v)
			}
			return nil
		})
	}
}

// TestIntegration_StoppedNodeGetsOnlyTheNewest (DESIGN §12): a node stopped during three
// successive deploys receives exactly the newest declaration when it starts again, and never
// runs the versions in between.
func TestIntegration_StoppedNodeGetsOnlyTheNewest(t *testing.T) {
	c := newCluster(t)
	retryUntil(t, 20*time.Second, func() error {
		_, err := admin.Register(c.ctx(), c.op, []byte("module: sleeper\nrequires: [mesh-bus]\n"))
		return err
	})
	dir := t.TempDir()
	for _, v := range []string{"1", "2", "3"} {
		path := filepath.Join(dir, "sleeper-"+v)
		os.WriteFile(path, []byte(fmt.Sprintf(sleeper, v)), 0o755)
		c.putArtifact("sleeper", v, path)
	}
	c.stop(2)
	for _, v := range []string{"1", "2", "3"} {
		c.deploy("sleeper", v, "c")
	}
	c.start(2)
	var out []byte
	retryUntil(t, 30*time.Second, func() error {
		ps := c.ps("sleeper")
		if len(ps) != 1 || ps[0].Version != "3" || ps[0].State != host.StateRunning || ps[0].Revision != ps[0].Declared {
			return fmt.Errorf("ps %+v", ps)
		}
		// Running is the process started: what it prints reaches the log a moment after.
		var err error
		if out, err = os.ReadFile(filepath.Join(c.cfgs[2].DataDir, "modules", "sleeper", "output.log")); err != nil || !strings.Contains(string(out), "v=3") {
			return fmt.Errorf("node c's output %q (%v)", out, err)
		}
		return nil
	})
	if strings.Contains(string(out), "v=1") || strings.Contains(string(out), "v=2") || !strings.Contains(string(out), "v=3") {
		t.Fatalf("node c's output %q: it ran an intermediate version", out)
	}
	c.auditGenuine() // a server stopped and back included
}

// BenchmarkDeployThree measures a deploy of one module to three nodes until all three
// processes run the new version (as the nodes report it): the time from the deploy request to
// the last report, p50 and p99 over b.N deploys (run with -benchtime 20x).
func BenchmarkDeployThree(b *testing.B) {
	c := newCluster(b)
	retryUntil(b, 20*time.Second, func() error {
		_, err := admin.Register(c.ctx(), c.op, []byte("module: sleeper\nrequires: [mesh-bus]\n"))
		return err
	})
	dir := b.TempDir()
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		v := fmt.Sprint(i + 1)
		// Stored just before: a deploy collects all but the newest three unnamed versions.
		path := filepath.Join(dir, "sleeper-"+v)
		os.WriteFile(path, []byte(fmt.Sprintf(sleeper, v)), 0o755)
		c.putArtifact("sleeper", v, path)
		start := time.Now()
		if _, err := admin.Deploy(c.ctx(), c.op, api.DeployRequest{Module: "sleeper", Deployment: api.Deployment{Version: v, All: true, Instances: 1}}); err != nil {
			b.Fatal(err)
		}
		for {
			ps := c.ps("sleeper")
			n := 0
			for _, p := range ps {
				if p.Version == v && p.State == host.StateRunning && p.PID > 0 {
					n++
				}
			}
			if n == 3 {
				break
			}
			time.Sleep(5 * time.Millisecond) // polling the controller's view: what the benchmark measures
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Milliseconds()), "p99-ms")
}

// BenchmarkSupervise50 measures what supervising 50 idle module processes costs the node: the
// growth of the (test) process's resident memory and Go heap from before the deploys to when
// all 50 run, and the CPU the process uses while they idle for 10 s (run with -benchtime 1x).
func BenchmarkSupervise50(b *testing.B) {
	bd := newBed(b)
	path := filepath.Join(b.TempDir(), "sleeper")
	os.WriteFile(path, []byte(fmt.Sprintf(sleeper, "1")), 0o755)
	runtime.GC()
	rssBefore, heapBefore := rss(b), heapInUse()
	for i := range 50 {
		m := fmt.Sprintf("idle-%02d", i)
		bd.register("module: " + m + "\nrequires: [mesh-bus]\n")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		obs, err := artifact.Lookup(ctx, bd.js)
		if err == nil {
			_, err = artifact.Put(ctx, obs, m, "1", path)
		}
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		bd.deploy(m, "1")
	}
	retryUntil(b, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ps, err := admin.Ps(ctx, bd.op)
		if err != nil {
			return err
		}
		n := 0
		for _, p := range ps {
			if p.State == host.StateRunning && p.PID > 0 {
				n++
			}
		}
		if n != 50 {
			return fmt.Errorf("%d of 50 running", n)
		}
		return nil
	})
	runtime.GC()
	rssAfter, heapAfter := rss(b), heapInUse()
	b.ResetTimer()
	cpu0 := cpuTime()
	idle := 10 * time.Second
	time.Sleep(idle) // the measured interval itself: the node idles with 50 processes
	cpu := cpuTime() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(rssAfter-rssBefore)/(1<<20), "rss-MiB")
	b.ReportMetric(float64(int64(heapAfter)-int64(heapBefore))/(1<<20), "heap-MiB")
	b.ReportMetric(100*cpu.Seconds()/idle.Seconds(), "cpu-%")
}

// rss is the process's resident set in bytes (/proc/self/statm).
func rss(tb testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		tb.Fatal(err)
	}
	var size, resident int64
	fmt.Sscan(string(b), &size, &resident)
	return resident * int64(os.Getpagesize())
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPushToRunning measures a push of a trivial Go module until its new build runs on
// its node (deployed with --auto): git notices the push, the controller plans, the builder
// runs go build, the controller deploys, the host starts it. p50 and max over b.N pushes
// (run with -benchtime 5x); the Go build cache is the machine's, warmed by a first build.
func BenchmarkPushToRunning(b *testing.B) {
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		b.Fatal(err)
	}
	b.Setenv("GOCACHE", strings.TrimSpace(string(gocache)))
	repo := testbed.NewGitRepo(b)
	bd := newBuilderBed(b, repo)
	bd.register("module: hello\nrequires: [mesh-bus]\nbuild: {from: shop/hello, run: go build -o \"$OUT\" .}\n")
	push := func(n int) string {
		return repo.Push(map[string]string{"hello/go.mod": "module hello\n\ngo 1.22\n",
			"hello/main.go": fmt.Sprintf("package main\n\nimport (\n\t\"fmt\"\n\t\"time\"\n)\n\nfunc main() {\n\tfmt.Println(\"hello %d\")\n\ttime.Sleep(time.Hour)\n}\n", n)})
	}
	push(0)
	bd.notify(b)
	first := bd.builds(b, 1)[0]
	if first.Status != "built" {
		b.Fatalf("the first build: %+v", first)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.Deploy(ctx, bd.op, api.DeployRequest{Module: "hello", Deployment: api.Deployment{Version: first.Version, All: true, Instances: 1, Auto: true}}); err != nil {
		b.Fatal(err)
	}
	bd.running(b, "hello", first.Version, 0)
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		commit := push(i + 1)
		bd.notify(b)
		bd.running(b, "hello", commit[:12], 0)
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(took[len(took)-1].Milliseconds()), "max-ms")
}

// TestIntegration_BuilderStopsMidBuild: the node running a build stops; the job goes to the
// other builder, which holds the seat next, and the cascade completes.
func TestIntegration_BuilderStopsMidBuild(t *testing.T) {
	repo := testbed.NewGitRepo(t)
	c := newClusterWith(t, func(i int, cfg *config.Config) {
		if i == 0 {
			cfg.GitRepos = map[string]string{"shop": repo.Bare}
		} else {
			cfg.Builder = true
		}
	})
	retryUntil(t, 20*time.Second, func() error {
		_, err := admin.Register(c.ctx(), c.op, []byte("module: slow\nbuild: {from: shop/slow, run: sh build.sh}\n"))
		return err
	})
	repo.Push(map[string]string{"slow/build.sh": "#!/bin/sh\nsleep 3\necho built > \"$OUT\"\n"})
	retryUntil(t, 10*time.Second, func() error {
		msg, err := c.op.Request(manifest.NodeToolSubject("a", build.GitNotifyTool), []byte(`{"repository":"shop"}`), 5*time.Second)
		if err == nil && strings.Contains(string(msg.Data), "error") {
			err = fmt.Errorf("%s", msg.Data)
		}
		return err
	})
	// The build runs: find its builder and stop it.
	var holder string
	retryUntil(t, 30*time.Second, func() error {
		builds, err := admin.Builds(c.ctx(), c.op)
		if err != nil || len(builds) == 0 || builds[len(builds)-1].Status != "running" {
			return fmt.Errorf("builds %+v %v", builds, err)
		}
		msg, err := c.op.Request(api.SeatListSubject, []byte("{}"), 5*time.Second)
		if err != nil {
			return err
		}
		var reply api.SeatListReply
		json.Unmarshal(msg.Data, &reply)
		for _, s := range reply.Seats {
			if s.Seat == build.BuilderSeat {
				holder = s.HolderAt
			}
		}
		if holder == "" {
			return errors.New("no builder holds the seat")
		}
		return nil
	})
	c.stop(slices.Index([]string{"a", "b", "c"}, holder))
	retryUntil(t, 60*time.Second, func() error {
		builds, err := admin.Builds(c.ctx(), c.op)
		if err != nil || len(builds) != 1 || builds[0].Status != "built" {
			return fmt.Errorf("builds %+v %v", builds, err)
		}
		return nil
	})
}
