package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/sandbox"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/bench"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/node"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

// The benchmarks report events/s, latencies and the mesh/raw ratios of issue 4:
//
//	go test -run '^$' -bench . -benchtime 20000x ./bench/
//
// BenchmarkEmitOn and BenchmarkToolCall also run the raw baseline in the same run and
// report the ratio; the Raw benchmarks run the baseline alone.

func TestMain(m *testing.M) {
	sandbox.Launcher() // a node in this test binary starts the binary as its launcher
	code := m.Run()
	nodes.close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// openNode opens and runs a throwaway node in dir; stop ends it.
func openNode(dir string) (t bench.Target, stop func() error, err error) {
	cfg := config.Up()
	cfg.DataDir = dir
	cfg.Name = "bench"
	cfg.RateLimit = 0 // the bench measures the mesh's paths, not its rate limits
	cfg.EmitRate = 0  // nor the admitter's pace (2,000 events a second a module by default)
	cfg.FloodRate = bench.NodeFloodRate
	cfg.ClientAddr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	n := node.New(cfg, nil)
	n.CreateIdentity = true
	if err := n.Open(); err != nil {
		return t, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	seeds := filepath.Join(dir, "bench-seeds")
	if err := os.Mkdir(seeds, 0o700); err != nil {
		cancel()
		<-done
		n.Close()
		return t, nil, err
	}
	stop = func() error {
		cancel()
		err := <-done
		if cerr := n.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return bench.Target{URL: n.ClientURL(), OperatorSeed: filepath.Join(dir, datadir.OperatorSeedFile), Dir: seeds}, stop, nil
}

// MustOpenNode opens a node for one test, stopped and removed at its cleanup.
func MustOpenNode(tb testing.TB) bench.Target {
	tb.Helper()
	t, stop, err := openNode(tb.TempDir())
	if err != nil {
		tb.Fatalf("open node: %v", err)
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Errorf("stop node: %v", err)
		}
	})
	return t
}

// nodes are the nodes the benchmarks share across their b.N rounds (a benchmark function
// runs several times), closed by TestMain: one for events and calls, one holding the
// 1,000-module fleet.
var nodes shared

type shared struct {
	mu    sync.Mutex
	stops []func() error
	dirs  []string

	main     *bench.Target
	fleet    *bench.Fleet
	fleetErr error
}

func (s *shared) open(tb testing.TB) bench.Target {
	tb.Helper()
	dir, err := os.MkdirTemp("", "meshnode-bench-")
	if err != nil {
		tb.Fatal(err)
	}
	s.dirs = append(s.dirs, dir)
	t, stop, err := openNode(dir)
	if err != nil {
		tb.Fatalf("open node: %v", err)
	}
	s.stops = append(s.stops, stop)
	return t
}

// target is the node of the event and call benchmarks.
func (s *shared) target(tb testing.TB) bench.Target {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.main == nil {
		t := s.open(tb)
		s.main = &t
	}
	return *s.main
}

// fleetOf is a fleet of n modules on a node of its own, registered once.
func (s *shared) fleetOf(b *testing.B, n int) *bench.Fleet {
	b.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fleet == nil && s.fleetErr == nil {
		t := s.open(b)
		ctx := context.Background()
		f, err := bench.OpenFleet(ctx, t)
		if err == nil {
			err = f.Grow(ctx, n)
		}
		s.fleet, s.fleetErr = f, err
	}
	if s.fleetErr != nil {
		b.Fatalf("register %d modules: %v", n, s.fleetErr)
	}
	return s.fleet
}

func (s *shared) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fleet != nil {
		s.fleet.Close()
	}
	for _, stop := range s.stops {
		if err := stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop bench node:", err)
		}
	}
	for _, dir := range s.dirs {
		os.RemoveAll(dir)
	}
}

// reportSeries reports a side's throughput and latencies.
func reportSeries(b *testing.B, prefix string, s bench.Series, rate string) {
	b.ReportMetric(s.PerSecond, prefix+rate)
	b.ReportMetric(float64(s.P50)/float64(time.Microsecond), prefix+"p50-µs")
	b.ReportMetric(float64(s.P99)/float64(time.Microsecond), prefix+"p99-µs")
}

// emitOnSession opens the emit→on measurement on the shared node, closed when b ends.
func emitOnSession(b *testing.B) *bench.EmitOnSession {
	s, err := bench.OpenEmitOn(context.Background(), nodes.target(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkEmitOn times b.N events through the mesh (sdk Emit → sdk On), then sends b.N
// through raw JetStream on the same node, untimed, for the ratio.
func BenchmarkEmitOn(b *testing.B) {
	ctx := context.Background()
	s := emitOnSession(b)
	b.ResetTimer()
	mesh, err := s.Mesh(ctx, b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	raw, err := s.Raw(ctx, b.N)
	if err != nil {
		b.Fatal(err)
	}
	reportSeries(b, "", mesh, "events/s")
	b.ReportMetric(raw.PerSecond, "raw-events/s")
	b.ReportMetric(mesh.PerSecond/raw.PerSecond, "mesh/raw")
}

// BenchmarkEmitOnPipelined times b.N events through the mesh with sdk EmitAsync and Flush,
// then b.N raw async publishes with one more drained consumer, and b.N bare, untimed, for
// the ratios.
func BenchmarkEmitOnPipelined(b *testing.B) {
	ctx := context.Background()
	s := emitOnSession(b)
	b.ResetTimer()
	mesh, err := s.Pipelined(ctx, b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	audited, err := s.RawAsync(ctx, b.N, true)
	if err != nil {
		b.Fatal(err)
	}
	bare, err := s.RawAsync(ctx, b.N, false)
	if err != nil {
		b.Fatal(err)
	}
	reportSeries(b, "", mesh, "events/s")
	b.ReportMetric(audited.PerSecond, "raw-audited-events/s")
	b.ReportMetric(bare.PerSecond, "raw-events/s")
	b.ReportMetric(mesh.PerSecond/audited.PerSecond, "mesh/raw-audited")
	b.ReportMetric(mesh.PerSecond/bare.PerSecond, "mesh/raw")
}

// BenchmarkEmitOnSignedFloor times b.N events through raw JetStream doing the seed's
// cryptography by hand (EmitOnResult.RawSigned: signed, verified by the consumer and by a
// drained second consumer), one at a time and pipelined, with the mesh's sides untimed for
// the ratios against the floor (issue 41).
func BenchmarkEmitOnSignedFloor(b *testing.B) {
	ctx := context.Background()
	s := emitOnSession(b)
	b.ResetTimer()
	floor, err := s.RawSigned(ctx, b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	asyncFloor, err := s.RawAsyncSigned(ctx, b.N)
	if err != nil {
		b.Fatal(err)
	}
	mesh, err := s.Mesh(ctx, b.N)
	if err != nil {
		b.Fatal(err)
	}
	pipelined, err := s.Pipelined(ctx, b.N)
	if err != nil {
		b.Fatal(err)
	}
	reportSeries(b, "", floor, "events/s")
	b.ReportMetric(asyncFloor.PerSecond, "async-events/s")
	b.ReportMetric(mesh.PerSecond/floor.PerSecond, "mesh/floor")
	b.ReportMetric(pipelined.PerSecond/asyncFloor.PerSecond, "pipelined/async-floor")
}

// BenchmarkEmitOnRaw times b.N events through raw JetStream: publish, durable pull consumer.
func BenchmarkEmitOnRaw(b *testing.B) {
	ctx := context.Background()
	s := emitOnSession(b)
	b.ResetTimer()
	raw, err := s.Raw(ctx, b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	reportSeries(b, "", raw, "events/s")
}

// BenchmarkToolCall makes b.N calls to a module's tool and b.N raw request/replies,
// alternating; ns/op is the mesh call's mean round trip.
func BenchmarkToolCall(b *testing.B) {
	t := nodes.target(b)
	ctx := context.Background()
	s, err := bench.OpenToolCall(ctx, t)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ResetTimer()
	mesh, raw, err := s.Both(ctx, b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(mesh.Mean), "ns/op")
	reportSeries(b, "", mesh, "calls/s")
	b.ReportMetric(float64(raw.P50)/float64(time.Microsecond), "raw-p50-µs")
	b.ReportMetric(float64(mesh.P50)/float64(raw.P50), "mesh/raw-p50")
}

// BenchmarkToolCallRaw makes b.N raw request/replies to a plain subscriber.
func BenchmarkToolCallRaw(b *testing.B) {
	t := nodes.target(b)
	ctx := context.Background()
	s, err := bench.OpenToolCall(ctx, t)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ResetTimer()
	raw, err := s.Raw(ctx, b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	reportSeries(b, "", raw, "calls/s")
}

// BenchmarkConnect1000 makes b.N sdk.Connects and b.N raw nats.Connects of one module
// among 1,000 registered (registered once, on a node of its own); ns/op is the sdk
// connect's mean.
func BenchmarkConnect1000(b *testing.B) {
	f := nodes.fleetOf(b, 1000)
	b.ResetTimer()
	all, err := f.Connects(context.Background(), b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	sdkS, unnamed, rawS := all.Named, all.Unnamed, all.Raw
	b.ReportMetric(float64(sdkS.Mean), "ns/op")
	b.ReportMetric(float64(sdkS.P50)/float64(time.Microsecond), "sdk-p50-µs")
	b.ReportMetric(float64(sdkS.P99)/float64(time.Microsecond), "sdk-p99-µs")
	b.ReportMetric(float64(rawS.P50)/float64(time.Microsecond), "raw-p50-µs")
	b.ReportMetric(float64(sdkS.P50)/float64(rawS.P50), "sdk/raw-p50")
	b.ReportMetric(float64(unnamed.P50)/float64(rawS.P50), "unnamed/raw-p50")
	b.ReportMetric(float64(all.RawAsk.P50)/float64(rawS.P50), "floor/raw-p50") // nats.go alone: connect, then whoami
	b.ReportMetric(float64(f.Took)/float64(time.Millisecond)/float64(f.Len()), "register-ms/module")
}

// TestBench_Smoke runs every measurement with tiny counts on a real node: the code works,
// nothing is lost, every figure is there. It asserts no performance target.
func TestBench_Smoke(t *testing.T) {
	target := MustOpenNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := bench.Run(ctx, target, bench.Config{Events: 200, Rounds: 2, Calls: 100, Modules: 12, Connects: 5})
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("\n%s", res)

	t.Run("EmitOn", func(t *testing.T) {
		e := res.EmitOn
		if e == nil {
			t.Fatal("no emit→on result")
		}
		for name, s := range map[string]bench.Series{"mesh": e.Mesh, "raw": e.Raw, "raw signed": e.RawSigned, "raw async signed": e.RawAsyncSigned} {
			if got, want := s.Count, 200; got != want {
				t.Errorf("%s: %d events arrived, want %d", name, got, want)
			}
			checkSeries(t, name, s)
		}
		if got, want := e.PayloadBytes, 256; got != want {
			t.Errorf("payload %d bytes, want %d", got, want)
		}
		if !(e.Ratio > 0) || !(e.SignedFloorRatio > 0) || !(e.PipelinedSignedFloorRatio > 0) {
			t.Errorf("ratio %v, against the signed floor %v, pipelined %v: want all > 0", e.Ratio, e.SignedFloorRatio, e.PipelinedSignedFloorRatio)
		}
		if e.Rounds != 2 || len(e.SignedFloorRatios) != 2 || len(e.PipelinedSignedFloorRatios) != 2 {
			t.Errorf("%d rounds, ratios %v and pipelined %v: want 2 of each", e.Rounds, e.SignedFloorRatios, e.PipelinedSignedFloorRatios)
		}
		if e.SignedFloorRatio != min(e.SignedFloorRatios[0], e.SignedFloorRatios[1]) || len(e.P99Ratios) != 2 || e.P99Ratio != min(e.P99Ratios[0], e.P99Ratios[1]) {
			t.Errorf("against the signed floor %v, p99 against raw's %v: want the lower middles of the rounds' %v, %v", e.SignedFloorRatio, e.P99Ratio, e.SignedFloorRatios, e.P99Ratios)
		}
	})
	t.Run("ToolCall", func(t *testing.T) {
		c := res.ToolCall
		if c == nil {
			t.Fatal("no tool-call result")
		}
		for name, s := range map[string]bench.Series{"mesh": c.Mesh, "raw": c.Raw} {
			if got, want := s.Count, 100; got != want {
				t.Errorf("%s: %d calls answered, want %d", name, got, want)
			}
			checkSeries(t, name, s)
		}
		if !(c.Ratio > 0) || !(c.RatioP99 > 0) {
			t.Errorf("ratios %v, %v, want > 0", c.Ratio, c.RatioP99)
		}
	})
	t.Run("Connect", func(t *testing.T) {
		c := res.Connect
		if c == nil {
			t.Fatal("no connect result")
		}
		if got, want := c.Modules, 12; got != want {
			t.Errorf("modules=%d, want %d", got, want)
		}
		for name, s := range map[string]bench.Series{"sdk": c.SDK, "sdk unnamed": c.SDKUnnamed, "raw": c.Raw, "raw and whoami": c.RawAsk, "sdk few": c.SDKFew, "raw few": c.RawFew} {
			if got, want := s.Count, 5; got != want {
				t.Errorf("%s: %d connects, want %d", name, got, want)
			}
			checkSeries(t, name, s)
		}
		if !(c.Ratio > 0) || !(c.RatioUnnamed > 0) || !(c.Floor > 0) || !(c.Growth > 0) || c.Register <= 0 || c.PerRegister <= 0 {
			t.Errorf("ratio %v, unnamed %v, floor %v, growth %v, register %v (%v each), want all > 0", c.Ratio, c.RatioUnnamed, c.Floor, c.Growth, c.Register, c.PerRegister)
		}
		// Module 0 and the probe, then ten generated in parallel: every one but the probe
		// is connected with its consumer, one in ten declares a seat, each registration timed.
		if c.Connected != 11 || c.Seats != 2 || c.Registrations.Count != 11 || c.Registrations.Max <= 0 || !(c.RegisterPerSecond > 0) {
			t.Errorf("connected %d (want 11), seats %d (want 2), registrations timed %d (want 11), slowest %v, %v/s",
				c.Connected, c.Seats, c.Registrations.Count, c.Registrations.Max, c.RegisterPerSecond)
		}
		if c.Node || c.Restart != nil || c.RSSConnected != 0 {
			t.Errorf("a node in this process was weighed or restarted: %+v", c)
		}
	})
	t.Run("Table", func(t *testing.T) {
		table := res.String()
		for _, want := range []string{"emit→on", "throughput", "signed floor", "tool call", "connect, 12 modules", "registration", "mesh/raw"} {
			if !strings.Contains(table, want) {
				t.Errorf("table lacks %q:\n%s", want, table)
			}
		}
	})
	// EmitOn and ToolCall remove their modules; Connect's 12 stay.
	t.Run("Cleanup", func(t *testing.T) {
		if n := countModules(t, target); n != 12 {
			t.Errorf("%d modules registered after the run, want the 12 of Connect", n)
		}
	})
}

func checkSeries(t *testing.T, name string, s bench.Series) {
	t.Helper()
	if s.Duplicates != 0 {
		t.Errorf("%s: %d duplicates", name, s.Duplicates)
	}
	if !(s.PerSecond > 0) || s.Elapsed <= 0 || s.P50 <= 0 || s.P99 < s.P50 || s.Mean <= 0 {
		t.Errorf("%s: figures missing or inconsistent: %+v", name, s)
	}
}

// countModules counts the registered modules, and fails t if a raw bench stream is left.
func countModules(t *testing.T, target bench.Target) int {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(target.OperatorSeed)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(target.URL, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mods, err := admin.List(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if strings.HasPrefix(name, "BENCH_RAW_") {
			t.Errorf("stream %s left behind", name)
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return len(mods)
}
