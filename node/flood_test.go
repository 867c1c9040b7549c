package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/heapfloor"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/sys/unix"
)

// floodBed is a node with a victim module (connects, fetches its secret, emits) and a module
// holding seat echo (its tool and its work queue are what a module floods of another's);
// each flood is an attacker module of its own (newAttacker), so that one barred for
// flooding leaves the next one unbarred.
type floodBed struct {
	b          *bed
	victimSeed string
	echoSeed   string
	victim     *sdk.Client
	attackers  int // registered so far
}

// attackerModule is one attacker's module: its name, seed file and public key.
type attackerModule struct{ name, seed, key string }

// What an attacker floods: each kind is a path a module can drive.
type floodKind string

const (
	floodWhoami   floodKind = "whoami"    // the controller's whoami, rate-limited per key
	floodFetch    floodKind = "fetch"     // the vault: its own secret and one it does not declare
	floodReport   floodKind = "report"    // host reports to mesh-controller: denied by the bus
	floodSeatTool floodKind = "seat-tool" // calls of another module's seat's tool
	floodSeatJob  floodKind = "seat-job"  // jobs for another module's seat (the admitter's to pace)
	floodEmit     floodKind = "emit"      // signed events (the admitter's to pace)
	floodAll      floodKind = "all"       // whoami, the vault and emits, paced (the integration bed)
)

// floodKinds are the kinds the benchmark measures, one after another.
var floodKinds = []floodKind{floodWhoami, floodFetch, floodReport, floodSeatTool, floodSeatJob, floodEmit}

// echoSeat is the seat the attackers call and send work to; its holder answers at once.
const echoSeat = `module: echo
requires: [mesh-bus]
seats:
  echo:
    scope: mesh
    retain: 1h
    accepts: [work]
    serves: [status]
`

func newFloodBed(tb testing.TB) *floodBed {
	tb.Helper()
	b := newBed(tb)
	vs, _ := b.register("module: victim\nrequires: [mesh-bus]\nemits: [tick]\nsecrets: [key]\n")
	es, _ := b.register(echoSeat)
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "victim", Name: "key"}, nil); err != nil {
		tb.Fatal(err)
	}
	return &floodBed{b: b, victimSeed: vs, echoSeed: es, victim: b.client(vs)}
}

// newAttacker registers a new attacker module, with a secret of its own to fetch.
func (f *floodBed) newAttacker(tb testing.TB) attackerModule {
	tb.Helper()
	f.attackers++
	name := fmt.Sprintf("attacker-%d", f.attackers)
	seed, reg := f.b.register("module: " + name + "\nrequires: [mesh-bus]\nemits: [noise]\nsecrets: [key]\nuses: [echo, mesh-controller]\n")
	if _, err := f.b.vault(api.VaultVerbMint, api.VaultRequest{Owner: name, Name: "key"}, nil); err != nil {
		tb.Fatal(err)
	}
	return attackerModule{name: name, seed: seed, key: reg.PublicKey}
}

// floodBatch and floodTick pace the integration bed's flood: floodBatch requests of each
// kind every floodTick, 2,000 a second of each — a hundred times the rate limits.
const (
	floodBatch = 20
	floodTick  = 10 * time.Millisecond
)

// flood runs the paced attacker of every kind in this process until stop is closed; it
// returns how many requests it sent.
func (f *floodBed) flood(tb testing.TB, stop <-chan struct{}) func() int64 {
	tb.Helper()
	var sent int64
	var err error
	a := f.newAttacker(tb)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sent, _, err = attack(attackConfig{URL: f.b.n.ClientURL(), Seed: a.seed, Key: a.key, Module: a.name, Kind: floodAll}, stop, func() bool { return true })
	}()
	return func() int64 {
		<-done
		if err != nil {
			tb.Fatal(err)
		}
		return sent
	}
}

// floodAttackerEnv, when set to an attackConfig in JSON, makes the test binary the attacker's
// process (see attackerProcess): a module is a program of its own, and an attacker inside
// the node's process would share its heap and scheduler, which no real module does.
const floodAttackerEnv = "MESHNODE_TEST_FLOOD_ATTACKER"

// attackConfig is what one attacker floods, and where.
type attackConfig struct {
	URL    string    `json:"url"`
	Seed   string    `json:"seed"`
	Key    string    `json:"key"`
	Module string    `json:"module"`
	Kind   floodKind `json:"kind"`
	// EchoSeed, for the kinds aimed at seat echo, is its module's seed: the attacker's
	// process holds the seat too, so that answering the flood costs the attacker's CPU,
	// not the node's process (where the benchmark measures the victim).
	EchoSeed string `json:"echo_seed,omitempty"`
}

// attacker is the attacker's process: it floods while switched on.
type attacker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out bytes.Buffer
}

// attackerCPU is the CPU the attacker's process is pinned to: the last one, so that it can
// take at most one core of the machine, as a module confined to a cgroup of one CPU would.
func attackerCPU() int { return runtime.NumCPU() - 1 }

// partitioned reports whether the benchmark can give the attacker a CPU of its own: taskset
// is there and the machine has two CPUs or more.
func partitioned() bool {
	_, err := exec.LookPath("taskset")
	return err == nil && runtime.NumCPU() >= 2
}

// pinning says how the node and the attacker's process are confined, for the benchmark's
// output.
func pinning() string {
	if !partitioned() {
		return fmt.Sprintf("attacker NOT pinned (no taskset or 1 CPU); %d CPUs shared", runtime.NumCPU())
	}
	return fmt.Sprintf("attacker pinned to CPU %d of %d (taskset); node and victim on the others, GOMAXPROCS %d",
		attackerCPU(), runtime.NumCPU(), runtime.GOMAXPROCS(0))
}

// pinNode confines this process — the node and the victim — to every CPU but the
// attacker's, as a cpuset cgroup partitions a machine between an agent and its workloads
// (Kubernetes' static CPU manager, Nomad's reserved cores). Without it the attacker's own
// spinning, once it is barred, shares a CPU with the node's threads and the kernel's
// scheduler, not the node, decides the victim's tail (measured: the victim's emit p99 2.2–2.8×
// idle after the bar with the barred attacker spinning, 1.0× with it asleep). It returns
// how to undo it.
func pinNode(tb testing.TB) (undo func()) {
	tb.Helper()
	if !partitioned() {
		return func() {}
	}
	var before, node unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		tb.Fatal(err)
	}
	for cpu := range runtime.NumCPU() {
		if cpu != attackerCPU() && before.IsSet(cpu) {
			node.Set(cpu)
		}
	}
	procs := runtime.GOMAXPROCS(node.Count())
	setAll := func(set *unix.CPUSet) {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			tb.Fatal(err)
		}
		for _, t := range tasks {
			if tid, err := strconv.Atoi(t.Name()); err == nil {
				unix.SchedSetaffinity(tid, set) // a thread gone since the listing is not an error
			}
		}
	}
	setAll(&node)
	return func() {
		setAll(&before)
		runtime.GOMAXPROCS(procs)
	}
}

// startAttacker starts kind's attacker as its own process, pinned to attackerCPU, off.
func (f *floodBed) startAttacker(tb testing.TB, kind floodKind) *attacker {
	tb.Helper()
	a := f.newAttacker(tb)
	cfg := attackConfig{URL: f.b.n.ClientURL(), Seed: a.seed, Key: a.key, Module: a.name, Kind: kind}
	if kind == floodSeatTool || kind == floodSeatJob {
		cfg.EchoSeed = f.echoSeed
	}
	env, _ := json.Marshal(cfg)
	args := []string{os.Args[0], "-test.run", "^$"}
	if partitioned() {
		args = append([]string{"taskset", "-c", fmt.Sprint(attackerCPU())}, args...)
	}
	at := &attacker{cmd: exec.Command(args[0], args[1:]...)}
	at.cmd.Env = append(os.Environ(), floodAttackerEnv+"="+string(env))
	var err error
	if at.in, err = at.cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	at.cmd.Stdout, at.cmd.Stderr = &at.out, &at.out
	if err := at.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { at.cmd.Process.Kill(); at.cmd.Wait() })
	return at
}

// set switches the flood on or off.
func (a *attacker) set(tb testing.TB, on bool) {
	if _, err := fmt.Fprintln(a.in, on); err != nil {
		werr := a.cmd.Wait() // its output is whole once it has exited
		tb.Fatalf("the attacker's process: %v (%v)\n%s", err, werr, a.out.String())
	}
}

// stop ends the attacker's process and returns how many messages it sent and how long
// after the flood began it was first disconnected (0: never).
func (a *attacker) stop(tb testing.TB) (sent int64, cut time.Duration) {
	a.in.Close()
	if err := a.cmd.Wait(); err != nil {
		tb.Fatalf("the attacker's process: %v\n%s", err, a.out.String())
	}
	if _, err := fmt.Sscan(a.out.String(), &sent, &cut); err != nil {
		tb.Fatalf("the attacker's process printed %q", a.out.String())
	}
	return sent, cut
}

// attackerProcess is the test binary started again as the attacker: it floods while the
// last line on its standard input is "true", and when the input closes prints how many
// messages it sent and when it was first disconnected.
func attackerProcess() {
	var cfg attackConfig
	if err := json.Unmarshal([]byte(os.Getenv(floodAttackerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "attacker: want an attackConfig in JSON:", err)
		os.Exit(2)
	}
	if cfg.EchoSeed != "" {
		stopEcho, err := holdEcho(cfg.URL, cfg.EchoSeed)
		if err != nil {
			fmt.Fprintln(os.Stderr, "attacker: hold seat echo:", err)
			os.Exit(1)
		}
		defer stopEcho()
	}
	var on atomic.Bool
	stop := make(chan struct{})
	go func() {
		lines := bufio.NewScanner(os.Stdin)
		for lines.Scan() {
			on.Store(lines.Text() == "true")
		}
		close(stop)
	}()
	sent, cut, err := attack(cfg, stop, on.Load)
	if err != nil {
		fmt.Fprintln(os.Stderr, "attacker:", err)
		os.Exit(1)
	}
	fmt.Println(sent, int64(cut))
}

// holdEcho holds seat echo: its tool answers at once, its jobs are taken and done.
func holdEcho(url, seed string) (stop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := sdk.Connect(ctx, url, seed)
	if err != nil {
		return nil, err
	}
	err = c.HoldSeat("echo", sdk.SeatHandlers{
		Accepts: map[string]sdk.JobHandler{"work": func(context.Context, sdk.Job) error { return nil }},
		Serves:  map[string]sdk.ToolHandler{"status": func(context.Context, sdk.Request) ([]byte, error) { return []byte(`{}`), nil }},
	})
	for err == nil && ctx.Err() == nil {
		if held, _ := c.Holding("echo"); held {
			return func() { c.Close() }, nil
		}
		time.Sleep(20 * time.Millisecond) // polling the holding, which the sdk does not announce
	}
	c.Close()
	return nil, fmt.Errorf("not holding echo: %v %v", err, ctx.Err())
}

// attack is the attacker: while on, the kind's messages as fast as one connection sends
// them (floodAll: paced, floodBatch of each every floodTick), reconnecting as soon as it
// may when the node disconnects it; until stop is closed. It returns how many it sent and
// how long after the flood began it was first disconnected.
func attack(cfg attackConfig, stop <-chan struct{}, on func() bool) (sent int64, cut time.Duration, err error) {
	raw, err := os.ReadFile(cfg.Seed)
	if err != nil {
		return 0, 0, err
	}
	kp, err := nkeys.ParseDecoratedNKey(raw)
	if err != nil {
		return 0, 0, err
	}
	var began, cutAt atomic.Int64
	nc, err := nats.Connect(cfg.URL, nats.Nkey(cfg.Key, kp.Sign), nats.CustomInboxPrefix(manifest.InboxPrefix(cfg.Module)),
		// A flooder comes back as soon as it may, and never gives up.
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.IgnoreAuthErrorAbort(),
		nats.ReconnectBufSize(-1), // disconnected, a send fails: sent counts what left
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
		nats.DisconnectErrHandler(func(*nats.Conn, error) {
			if b := began.Load(); b != 0 {
				cutAt.CompareAndSwap(0, time.Now().UnixNano()-b)
			}
		}))
	if err != nil {
		return 0, 0, err
	}
	defer nc.Close()
	sk, _ := envelope.NewSigningKey(kp)
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	whoami, _ := json.Marshal(api.WhoamiRequest{PublicKey: cfg.Key})
	fetch, _ := json.Marshal(api.VaultRequest{XKey: xpub, Name: "key"})
	undeclared, _ := json.Marshal(api.VaultRequest{XKey: xpub, Name: "not-mine"})
	inbox := manifest.InboxPrefix(cfg.Module) + ".flood"
	caller := api.VaultToolSubject(api.VaultVerbFetch, api.VaultModuleCaller(cfg.Module))
	emit := manifest.EventSubject(cfg.Module, "noise")
	report := manifest.SeatAcceptSubject(manifest.ControllerSeat, "report")
	job := manifest.SeatAcceptSubject("echo", "work")
	tool := manifest.SeatToolSubject("echo", "status")
	body := []byte(`{"noise":true}`)
	// signed is a message as the sdk sends it: stamped and signed, so that what the node
	// stores and audits is a genuine event or job.
	// Events and jobs go out under the module's prefix, for the node's admitter; the report,
	// which only a node may send, on the work queue's own subject.
	signed := func(subject string, admitted bool) *nats.Msg {
		h, _ := envelope.Stamp(sk, cfg.Module, "alpha", subject, body, envelope.Options{})
		if admitted {
			subject = manifest.AdmitSubject(cfg.Module, subject)
		}
		return &nats.Msg{Subject: subject, Header: h, Data: body}
	}
	count := func(err error) {
		if err == nil {
			sent++
		}
	}
	send := map[floodKind]func(){
		floodWhoami: func() {
			count(nc.PublishRequest(api.WhoamiSubject(cfg.Key), api.BootstrapInbox(cfg.Key)+".flood", whoami))
		},
		floodFetch: func() {
			count(nc.PublishRequest(caller, inbox, fetch))
			count(nc.PublishRequest(caller, inbox, undeclared))
		},
		floodReport:   func() { count(nc.PublishMsg(signed(report, false))) },
		floodSeatTool: func() { count(nc.PublishRequest(tool, inbox, body)) },
		floodSeatJob:  func() { count(nc.PublishMsg(signed(job, true))) },
		floodEmit:     func() { count(nc.PublishMsg(signed(emit, true))) },
	}
	if cfg.Kind == floodAll {
		tick := time.NewTicker(floodTick)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return sent, time.Duration(cutAt.Load()), nil
			case <-tick.C:
			}
			for range floodBatch {
				send[floodWhoami]()
				send[floodFetch]()
				send[floodEmit]()
			}
			nc.Flush()
		}
	}
	f := send[cfg.Kind]
	if f == nil {
		return 0, 0, fmt.Errorf("no flood of kind %q", cfg.Kind)
	}
	for {
		select {
		case <-stop:
			return sent, time.Duration(cutAt.Load()), nil
		default:
		}
		if !on() {
			time.Sleep(time.Millisecond) // switched off: the switch is polled, not announced
			continue
		}
		began.CompareAndSwap(0, time.Now().UnixNano())
		for range 256 { // unpaced: only the socket's back-pressure slows it
			f()
		}
	}
}

// victimOps are the three things the victim must keep doing under a flood.
func (f *floodBed) victimOps(tb testing.TB) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"connect": func(ctx context.Context) error {
			c, err := sdk.Connect(ctx, f.b.n.ClientURL(), f.victimSeed)
			if err == nil {
				c.Close()
			}
			return err
		},
		"fetch": func(ctx context.Context) error { _, err := f.victim.Secret(ctx, "key"); return err },
		"emit": func(ctx context.Context) error {
			_, err := f.victim.Emit(ctx, "tick", map[string]int{"n": 1})
			return err
		},
	}
}

// victimOrder is the order the victim's operations take turns in.
var victimOrder = []string{"connect", "fetch", "emit"}

// victimPace spaces the victim's operations: a module working steadily, its connects (one
// whoami each) and fetches within the rate limit, while the attacker goes as fast as it can.
const victimPace = 5 * time.Millisecond

// The benchmark's phases, for each kind: the victim alone, then under the flood, as long
// as each other, so that both p99s are the 99th percentile of some 660 samples, not the
// worst two or three. The flooded phase is the first ten seconds of a flood that keeps on —
// the attacker barred, then coming back as soon as it may, refused — and so holds the
// bar's detection once (a few hundred milliseconds at most: transient, reported apart).
const (
	idlePhase  = 10 * time.Second
	floodPhase = 10 * time.Second
	// transientPhase is the start of the flood reported apart: the victim's worst latency
	// while the node finds the flooder and bars it.
	transientPhase = time.Second
)

// BenchmarkVictimUnderFlood measures the victim's connect, fetch and emit latency while
// another module floods — each kind in turn, unpaced, as fast as one client sends, from a
// process of its own pinned to one CPU — against the same operations just before, with the
// attacker's process connected and idle (issue 35: the p99 under a flood within 2× of
// idle). A flood that keeps on is the node's to end (the flood watch bars the module, and
// the attacker keeps reconnecting, refused), so the flooded phase counts from the flood's
// first message, its detection included. It reports each operation's idle and flooded p99,
// their ratio, its worst latency in the flood's first second (while the node finds and bars
// the flooder), the attacker's rate and when it was first cut off; and the ratio of the p99s
// of every run's samples so far (floodPool).
// Run: go test ./node -run '^$' -bench VictimUnderFlood -benchtime 1x -count 5
func BenchmarkVictimUnderFlood(b *testing.B) {
	defer pinNode(b)()
	defer heapfloor.Keep(context.Background())() // as the node's process keeps it (cmd/meshnode)
	b.Log(pinning())
	f := newFloodBed(b)
	defer f.b.close()
	ops := f.victimOps(b)
	for _, kind := range floodKinds {
		b.Run(string(kind), func(b *testing.B) {
			a := f.startAttacker(b, kind)
			idle := victimDuring(b, ops, idlePhase)
			a.set(b, true)
			flooded := victimDuring(b, ops, floodPhase)
			a.set(b, false)
			sent, cut := a.stop(b)
			if sent == 0 {
				b.Fatal("the attacker sent nothing")
			}
			line := []string{fmt.Sprintf("%-9s %8d sent, cut off after %v:", kind, sent, cut.Round(time.Millisecond))}
			var transient []string
			for _, op := range victimOrder {
				i, fl := percentile(latencies(idle[op]), 99), percentile(latencies(flooded[op]), 99)
				ratio := float64(fl) / float64(max(i, 1))
				worst := slices.Max(append(latencies(within(flooded[op], transientPhase)), 0))
				b.ReportMetric(float64(i.Microseconds()), op+"-idle-p99-µs")
				b.ReportMetric(float64(fl.Microseconds()), op+"-flood-p99-µs")
				b.ReportMetric(ratio, op+"-p99-ratio")
				b.ReportMetric(float64(worst.Microseconds()), op+"-transient-max-µs")
				line = append(line, fmt.Sprintf("%s p99 %v→%v (%.2f×)", op, i.Round(10*time.Microsecond), fl.Round(10*time.Microsecond), ratio))
				transient = append(transient, fmt.Sprintf("%s %v", op, worst.Round(100*time.Microsecond)))
			}
			b.ReportMetric(float64(sent), "attack-sent")
			b.ReportMetric(float64(cut.Milliseconds()), "cut-after-ms")
			b.Log(strings.Join(line, " ") + "; worst in its first second: " + strings.Join(transient, ", "))
			p := floodPool.add(kind, idle, flooded)
			pooled := []string{fmt.Sprintf("%-9s over %d runs:", kind, p.runs)}
			for _, op := range victimOrder {
				i, fl := percentile(latencies(p.idle[op]), 99), percentile(latencies(p.flooded[op]), 99)
				ratio := float64(fl) / float64(max(i, 1))
				b.ReportMetric(ratio, op+"-pooled-p99-ratio")
				pooled = append(pooled, fmt.Sprintf("%s p99 %v→%v (%.2f×)", op, i.Round(10*time.Microsecond), fl.Round(10*time.Microsecond), ratio))
			}
			b.Log(strings.Join(pooled, " "))
		})
	}
}

// floodPool gathers each kind's samples over the benchmark's runs (-count) in one process: the
// p99 of one run's 660-odd samples, a few hundred microseconds idle, moves by half from run to
// run with nothing flooding (an idle emit's p99 was 320–550 µs over five runs of one CI
// benchmark), so each run's ratio is printed and, beside it, the ratio of the p99s of every
// run's samples so far — the last run's line covers all of them.
var floodPool = pools{}

type pools map[floodKind]*pooled

type pooled struct {
	runs          int
	idle, flooded map[string][]sample
}

// add adds a run's samples of kind and returns the kind's pool.
func (ps pools) add(kind floodKind, idle, flooded map[string][]sample) *pooled {
	p := ps[kind]
	if p == nil {
		p = &pooled{idle: map[string][]sample{}, flooded: map[string][]sample{}}
		ps[kind] = p
	}
	p.runs++
	for op, ss := range idle {
		p.idle[op] = append(p.idle[op], ss...)
	}
	for op, ss := range flooded {
		p.flooded[op] = append(p.flooded[op], ss...)
	}
	return p
}

// sample is one of the victim's operations: when it began, from the phase's start, and
// how long it took.
type sample struct{ at, took time.Duration }

// latencies are the samples' durations.
func latencies(ss []sample) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = s.took
	}
	return out
}

// within are the samples that began in the phase's first d.
func within(ss []sample, d time.Duration) []sample {
	i := slices.IndexFunc(ss, func(s sample) bool { return s.at >= d })
	if i < 0 {
		return ss
	}
	return ss[:i]
}

// victimDuring runs the victim's operations in turn, every victimPace, for d; it returns
// each operation's samples.
func victimDuring(b *testing.B, ops map[string]func(context.Context) error, d time.Duration) map[string][]sample {
	out := map[string][]sample{}
	pace := time.NewTicker(victimPace)
	defer pace.Stop()
	begin := time.Now()
	for i, end := 0, begin.Add(d); time.Now().Before(end); i++ {
		<-pace.C
		op := victimOrder[i%len(victimOrder)]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		err := ops[op](ctx)
		took := time.Since(start)
		cancel()
		if err != nil {
			b.Fatalf("victim %s: %v", op, err)
		}
		out[op] = append(out[op], sample{at: start.Sub(begin), took: took})

	}
	return out
}

// percentile is the nearest-rank p-th percentile of ds (0 for none).
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := (len(s)*p+99)/100 - 1
	return s[min(max(i, 0), len(s)-1)]
}
