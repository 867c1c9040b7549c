package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"

	"github.com/meshnode/meshnode/bench"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/formats"
	"github.com/meshnode/meshnode/internal/heapfloor"
	"github.com/meshnode/meshnode/node"
	"github.com/spf13/cobra"
)

// maxRounds bounds --rounds: a session's runs are told apart by a count modulo 256 (bench's
// run ids), and 20 rounds of 20,000 events each way are minutes already.
const maxRounds = 20

func newBenchCmd() *cobra.Command {
	var cfg bench.Config
	var asJSON, nodeProcess bool
	var cpus int
	var prof profiles
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the mesh against raw NATS on a throwaway node on this machine",
		Example: `  meshnode bench
  meshnode bench --events 20000 --json
  meshnode bench --calls 0 --modules 0 --cpuprofile cpu.pprof --memprofile mem.pprof   # then: go tool pprof -top cpu.pprof`,
		Long: `Start a throwaway node in a temporary data dir on free loopback ports, measure what
the mesh costs over raw NATS on its embedded server, print the figures and the ratios, and
remove the node and its data. A running node is not touched.

  emit→on    --events persistent 256-byte events, sdk Emit → sdk On, against raw
             JetStream publish → durable pull consumer (one synchronous publish at a time
             on both sides): throughput and p50/p99 latency; target mesh ≥ 0.65× raw.
             Then pipelined: sdk EmitAsync + Flush against raw async publishes (up to
             1,024 unanswered on both sides), bare and with one more durable consumer
             drained alongside (what an audit log costs the broker): targets ≥ 0.65× and
             ≥ 0.8×. And against the signed floor: raw JetStream doing the seed's
             cryptography by hand with the mesh's own Sign and Verify (the publisher
             signs each event, the consumer verifies each before its ack, a second
             durable consumer drained alongside verifies each too), one at a time and
             pipelined: targets ≥ 0.85× and ≥ 1.0× (issue 41). The mesh runs --rounds
             times each way, each round back to back with the floor, the two in turn
             first (the first round is the node's first events): every figure printed is
             the median of the rounds', a ratio with the floor the median of the rounds'
             ratios, and each round's ratios are printed too.
  tool call  --calls round trips to a module's tool (sdk Serve), against a plain
             subscriber on a plain subject: p50/p99; target mesh ≤ 1.1× raw.
  connect    register --modules generated modules (one in ten declaring a seat), 8 at a
             time, connect them all, 8 at a time, each starting its durable consumer, and
             keep them connected while sdk.Connect and a raw nkey nats.Connect of one more
             module are timed, against the same with 2 registered (target growth ≤ 1.15×).
             With --node-process the node runs as a process of its own: its RSS is read
             with every module registered and again with all connected, and it is
             restarted (SIGTERM) to time the registry mirror's catch-up and the
             controller's reconcile of every module. One node, not a mesh.

--cpus N runs the whole bench — the node (its process too, with --node-process), the modules
and the raw clients — on the first N CPUs it may run on: it executes itself again there, and
Go's GOMAXPROCS follows. The figures say how many CPUs the run had; comparing runs at 1 and 2
CPUs shows what the mesh gains from a core (docs/performance.md, "Cores").

--cpuprofile and --memprofile write Go profiles of the whole run: the node, the modules and
the raw clients share the process (pprof's -focus tells their code apart; a count of 0 leaves
a measurement out of it), except with --node-process, where the node is not profiled. docs/performance.md reads them.

A count of 0 skips that measurement. Figures go to stdout; progress goes to stderr when it is
a terminal (piped or redirected, stderr keeps only warnings and errors).`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("bench takes no arguments, only flags (see meshnode bench --help)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case cfg.Events < 0 || cfg.Calls < 0 || cfg.Modules < 0:
				return usagef("--events, --calls and --modules count things: 0 or more")
			case cfg.Rounds < 1 || cfg.Rounds > maxRounds:
				return usagef("--rounds %d: emit→on's comparisons with the signed floor run 1 to %d times", cfg.Rounds, maxRounds)
			case cfg.Modules == 1:
				return usagef("--modules 1: the connect measurement needs at least 2 modules (or 0 to skip it)")
			case cfg.Events == 0 && cfg.Calls == 0 && cfg.Modules == 0:
				return usagef("nothing to measure: --events, --calls and --modules are all 0")
			case cpus < 0:
				return usagef("--cpus %d: a number of CPUs, or 0 for all this process may run on", cpus)
			}
			if cpus > 0 {
				if err := pinCPUs(cpus); err != nil {
					return err
				}
			}
			stopProfiles, err := prof.start()
			if err != nil {
				return err
			}
			err = runBench(cmd.Context(), cfg, nodeProcess, asJSON, cmd.OutOrStdout(), cmd.ErrOrStderr())
			return errors.Join(err, stopProfiles())
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Events, "events", bench.DefaultEvents, "events sent on each side of emit→on (0: skip)")
	f.IntVar(&cfg.Rounds, "rounds", bench.DefaultRounds, "rounds of emit→on's mesh and signed floor, one at a time and pipelined, 1 to 20: the medians are printed")
	f.IntVar(&cfg.Calls, "calls", bench.DefaultCalls, "tool calls made on each side (0: skip)")
	f.IntVar(&cfg.Modules, "modules", bench.DefaultModules, "modules registered before timing connects (0: skip)")
	f.StringVar(&prof.cpu, "cpuprofile", "", "write a CPU profile of the run to this file")
	f.StringVar(&prof.mem, "memprofile", "", "write an allocation profile of the run to this file")
	f.IntVar(&cpus, "cpus", 0, "run the whole bench (node, modules, raw clients) on this many CPUs: the first it may run on (0: all)")
	f.BoolVar(&nodeProcess, "node-process", false, "run the node as a process of its own (meshnode up): the connect measurement then reads its RSS and restarts it")
	f.BoolVar(&asJSON, "json", false, "print one JSON object, durations in nanoseconds, a skipped measurement left out: cpus, gomaxprocs, emit_on?, tool_call?, connect?")
	return cmd
}

// profiles are the Go profiles bench writes, when asked.
type profiles struct{ cpu, mem string }

// start starts the CPU profile; stop ends it and writes the allocation profile.
func (p profiles) start() (stop func() error, err error) {
	var cpu *os.File
	if p.cpu != "" {
		if cpu, err = os.Create(p.cpu); err != nil {
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			cpu.Close()
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
	}
	if p.mem != "" {
		runtime.MemProfileRate = 64 << 10 // a sample each 64 KiB allocated (512 KiB by default)
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			errs = append(errs, cpu.Close())
		}
		if p.mem != "" {
			f, err := os.Create(p.mem)
			if err != nil {
				return errors.Join(append(errs, fmt.Errorf("--memprofile: %w", err))...)
			}
			errs = append(errs, pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
		}
		return errors.Join(errs...)
	}, nil
}

// runBench runs the measurements on a throwaway node and prints the results.
func runBench(ctx context.Context, cfg bench.Config, nodeProcess, asJSON bool, stdout, stderr io.Writer) (err error) {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg.Connects = bench.DefaultConnects
	// The collector's floor of a node's process (up), for the node run here and for the raw
	// side alike: both are measured in a process that keeps it.
	defer heapfloor.Keep(ctx)()

	dir, err := os.MkdirTemp("", "meshnode-bench-")
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(dir)
	var target bench.Target
	if nodeProcess {
		var p *benchProcess
		if target, p, err = openBenchProcess(ctx, dir); err != nil {
			return err
		}
		defer p.Close()
		defer func() {
			if err != nil { // the node's side of it, before its data dir goes
				err = fmt.Errorf("%w\nthe node's log ends:\n%s", err, tail(p.logFile(p.logs)))
			}
		}()
	} else {
		t, closeNode, err := openBenchNode(dir, stderr)
		if err != nil {
			return err
		}
		defer closeNode()
		target = t
	}
	// Progress on a terminal only: piped or redirected, stderr keeps the warnings and errors.
	progress := io.Discard
	if isTerminal(stderr) {
		progress = stderr
	}
	target.Log = slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{Level: slog.LevelInfo})).With("bench", "meshnode")

	fmt.Fprintf(progress, "meshnode bench: a throwaway node at %s (%s/%s, %d CPUs, %s)\n",
		target.URL, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), formats.MeshnodeVersion())
	res, err := bench.Run(ctx, target, cfg)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	_, err = res.WriteTo(stdout)
	return err
}

// openBenchNode opens and runs a node in dir on free loopback ports; closeNode stops it.
func openBenchNode(dir string, stderr io.Writer) (t bench.Target, closeNode func(), err error) {
	cfg := config.Up()
	cfg.DataDir = dir
	cfg.Name = "bench"
	cfg.RateLimit = 0 // the bench measures the mesh's paths, not its rate limits
	cfg.EmitRate = 0  // nor the admitter's pace (2,000 events a second a module by default)
	cfg.FloodRate = bench.NodeFloodRate
	cfg.ClientAddr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n := node.New(cfg, log)
	n.CreateIdentity = true
	if err := n.Open(); err != nil {
		return t, nil, fmt.Errorf("bench: open a throwaway node in %s: %w", dir, err)
	}
	seeds := filepath.Join(dir, "bench-seeds")
	if err := os.Mkdir(seeds, 0o700); err != nil {
		n.Close()
		return t, nil, fmt.Errorf("bench: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	closeNode = func() {
		// JetStream stops durable consumers one by one, ~10 ms each: after the connect
		// measurement this takes seconds, so say what the pause is.
		if isTerminal(stderr) {
			fmt.Fprintln(stderr, "meshnode bench: stopping the throwaway node and removing its data")
		}
		cancel()
		if err := <-done; err != nil {
			log.Warn("throwaway node stopped with an error", "err", err)
		}
		if err := n.Close(); err != nil {
			log.Warn("close throwaway node", "err", err)
		}
	}
	t = bench.Target{URL: n.ClientURL(), OperatorSeed: filepath.Join(dir, datadir.OperatorSeedFile), Dir: seeds}
	return t, closeNode, nil
}

// isTerminal reports whether w is a terminal (a character device), where progress belongs.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
