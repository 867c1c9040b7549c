package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/sync/errgroup"
)

// seatEvery is how often a generated module declares a seat the following ones use: one
// module in ten, as issue 37's 10,000 modules with 1,000 seats.
const seatEvery = 10

// ConnectResult is the connect measurement: how long a module takes to connect (nkey auth,
// permissions derived from its manifest, and for the sdk the whoami round trip) once the
// registry holds Modules modules, and the same module with only two registered.
type ConnectResult struct {
	// Modules is how many modules were registered, Seats how many seats they declare.
	Modules int `json:"modules"`
	Seats   int `json:"seats"`
	// Workers is how many registrations, and connects of the fleet, were under way at once.
	Workers int `json:"workers"`
	// Register is the time it took to register them all; PerRegister is Register / Modules
	// and RegisterPerSecond its inverse. In nanoseconds in JSON.
	Register          time.Duration `json:"register_ns"`
	PerRegister       time.Duration `json:"per_register_ns"`
	RegisterPerSecond float64       `json:"register_per_second"`
	// Registrations are the registrations' round trips, Workers at a time: p50, p99.
	Registrations Series `json:"registrations"`
	// ConnectAll is the time it took to connect Connected modules (all but the probe), each
	// starting its durable consumer; they stayed connected while the probe's connects with
	// all registered were timed.
	ConnectAll time.Duration `json:"connect_all_ns"`
	Connected  int           `json:"connected"`
	// Node says the node ran in a process of its own (Target.Node), so the figures below
	// were taken; without one they are zero.
	Node bool `json:"node_process"`
	// RSSIdle is the node's resident memory with every module registered and none
	// connected, RSSConnected with Connected connected; RSSPer1000 is the difference per
	// 1,000 connected modules. In bytes.
	RSSIdle      int64 `json:"rss_idle_bytes"`
	RSSConnected int64 `json:"rss_connected_bytes"`
	RSSPer1000   int64 `json:"rss_per_1000_bytes"`
	// Restart is the node's restart with every module registered, the modules disconnected.
	Restart *Restarted `json:"restart,omitempty"`
	// Connects is how many connects each series made.
	Connects int `json:"connects"`
	// SDK is sdk.Connect named for its module (sdk.AsModule, or MESH_MODULE as a node's
	// host sets it: one connection, whoami asked on it); SDKUnnamed is sdk.Connect with the
	// seed alone (a bootstrap connection asking whoami, then the module's connection); Raw
	// is nats.Connect with the module's nkey. All with Modules registered.
	SDK        Series `json:"sdk"`
	SDKUnnamed Series `json:"sdk_unnamed"`
	Raw        Series `json:"raw"`
	// RawAsk is nats.Connect with the module's nkey and then one whoami request with
	// nats.go alone: the floor of any connect that learns the module's declarations, which
	// the sdk must (what it emits and consumes, whose signatures it checks, the seat
	// versions it is pinned to).
	RawAsk Series `json:"raw_ask"`
	// SDKFew and RawFew are the same with two modules registered.
	SDKFew Series `json:"sdk_few"`
	RawFew Series `json:"raw_few"`
	// Ratio is SDK.P50 / Raw.P50: what the whoami round trip adds (target ≤ 1.3);
	// RatioUnnamed is SDKUnnamed.P50 / Raw.P50.
	Ratio        float64 `json:"ratio"`
	RatioUnnamed float64 `json:"ratio_unnamed"`
	// Floor is RawAsk.P50 / Raw.P50: the same connect and question with nats.go alone, in
	// the same run.
	Floor float64 `json:"floor"`
	// Growth is SDK.P50 / SDKFew.P50: what a full registry adds.
	Growth float64 `json:"growth"`
}

// Connect registers modules generated modules and measures connects of one of them
// (connects each way, in turn: see Fleet.Connects), first with two modules registered, then
// with all of them registered and connected, each with its consumer (see Fleet.ConnectAll).
// With a Target.Node it also weighs the node before and after the modules connect, and
// restarts it (see Restart). The modules stay registered: use a throwaway node.
func Connect(ctx context.Context, t Target, modules, connects int) (ConnectResult, error) {
	if modules < 2 {
		return ConnectResult{}, fmt.Errorf("connect needs at least 2 modules, not %d", modules)
	}
	f, err := OpenFleet(ctx, t)
	if err != nil {
		return ConnectResult{}, err
	}
	defer f.Close()
	res := ConnectResult{Modules: modules, Connects: connects, Workers: workers, Node: t.Node != nil}
	few, err := f.Connects(ctx, connects)
	if err != nil {
		return res, err
	}
	res.SDKFew, res.RawFew = few.Named, few.Raw
	t.log().Info("registering modules", "modules", modules, "in parallel", workers)
	if err := f.Grow(ctx, modules); err != nil {
		return res, err
	}
	res.Register = f.Took
	res.PerRegister = f.Took / time.Duration(f.Len())
	res.RegisterPerSecond = float64(f.Len()) / f.Took.Seconds()
	res.Registrations = f.Registrations()
	res.Seats = f.Seats()
	if t.Node != nil {
		if res.RSSIdle, err = t.Node.RSS(); err != nil {
			return res, err
		}
	}
	t.log().Info("connecting every module with its consumer", "modules", modules, "in parallel", workers)
	start := time.Now()
	if err := f.ConnectAll(ctx); err != nil {
		return res, err
	}
	res.ConnectAll = time.Since(start)
	res.Connected = f.Connected()
	if t.Node != nil {
		if res.RSSConnected, err = t.Node.RSS(); err != nil {
			return res, err
		}
		res.RSSPer1000 = (res.RSSConnected - res.RSSIdle) * 1000 / int64(max(res.Connected, 1))
	}
	t.log().Info("connects", "modules", modules, "connected", res.Connected, "connects", connects)
	all, err := f.Connects(ctx, connects)
	if err != nil {
		return res, err
	}
	res.SDK, res.SDKUnnamed, res.Raw, res.RawAsk = all.Named, all.Unnamed, all.Raw, all.RawAsk
	res.Ratio = ratio(float64(res.SDK.P50), float64(res.Raw.P50))
	res.RatioUnnamed = ratio(float64(res.SDKUnnamed.P50), float64(res.Raw.P50))
	res.Floor = ratio(float64(res.RawAsk.P50), float64(res.Raw.P50))
	res.Growth = ratio(float64(res.SDK.P50), float64(res.SDKFew.P50))
	if t.Node == nil {
		return res, nil
	}
	if err := f.DisconnectAll(); err != nil {
		return res, err
	}
	t.log().Info("restarting the node", "modules", modules)
	r, err := t.Node.Restart(ctx)
	if err != nil {
		return res, fmt.Errorf("restart the node: %w", err)
	}
	// The registry as the restarted node's controller answers it: every module, or its
	// mirror had not caught up when the node said it was ready.
	op, err := t.operator("bench-restarted")
	if err != nil {
		return res, err
	}
	defer op.Close()
	lctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	listed, err := admin.List(lctx, op)
	if err != nil {
		return res, fmt.Errorf("list the modules after the restart: %w", err)
	}
	r.Modules = len(listed)
	res.Restart = &r
	return res, nil
}

// workers is how many registrations, and how many connects of the fleet, are under way at
// once: modules arrive together on a real mesh, and one at a time the client's round trips
// would be timed rather than the node.
const workers = 8

// Fleet is a set of generated modules registered on the target, and one of them, the
// probe, whose connects are measured.
//
// Module 0 declares a seat; the probe emits, consumes module 0's event, serves a tool and
// uses the seat, so whoami has a seat to look up. The others follow the same pattern: each
// emits two events, consumes one of the module before it (so each has a durable consumer on
// EVENTS), serves a tool, and every seatEvery-th declares a seat that the next ones use.
type Fleet struct {
	t     Target
	op    *nats.Conn
	gen   generator
	probe string // the probe's module name
	seed  string // the probe's seed file
	n     int    // modules registered

	seeds     []string        // the seed files of generated module i, by i
	tookEach  []time.Duration // how long each generated module's registration took (Grow's), by i
	connected []*sdk.Client   // the generated modules ConnectAll connected

	// Took is the time spent registering.
	Took time.Duration
}

// OpenFleet registers module 0 and the probe.
func OpenFleet(ctx context.Context, t Target) (f *Fleet, err error) {
	id := runID()
	f = &Fleet{t: t, gen: generator{prefix: "bc-" + id + "-", seats: "bs-" + id + "-"}}
	if f.op, err = t.operator("bench-registrar"); err != nil {
		return nil, err
	}
	start := time.Now()
	seed0, err := t.register(ctx, f.op, f.gen.manifest(0))
	if err != nil {
		f.Close()
		return nil, err
	}
	took0 := time.Since(start)
	if f.seed, err = t.register(ctx, f.op, f.gen.probe()); err != nil {
		f.Close()
		return nil, err
	}
	f.Took, f.n, f.probe = time.Since(start), 2, f.gen.probeName()
	f.seeds, f.tookEach = []string{seed0}, []time.Duration{took0}
	return f, nil
}

// Len is the number of modules registered.
func (f *Fleet) Len() int { return f.n }

// Registrations are the round trips of Grow's registrations, each from its request to its
// reply (Elapsed: Took).
func (f *Fleet) Registrations() Series {
	var each []time.Duration
	for _, d := range f.tookEach {
		if d > 0 {
			each = append(each, d)
		}
	}
	return newSeries(each, f.Took)
}

// Seats is the number of seats the generated modules declare.
func (f *Fleet) Seats() int { return (len(f.seeds) + seatEvery - 1) / seatEvery }

// Grow registers generated modules until the fleet has total, workers at a time: first the
// modules that declare a seat, then the ones that use them (a module may name a seat only
// once it is declared).
func (f *Fleet) Grow(ctx context.Context, total int) error {
	first := len(f.seeds) // generated module index; the probe is the fleet's other module
	last := total - 1     // exclusive: total less the probe
	if first >= last {
		return nil
	}
	start := time.Now()
	defer func() { f.Took += time.Since(start) }()
	f.seeds = append(f.seeds, make([]string, last-first)...)
	f.tookEach = append(f.tookEach, make([]time.Duration, last-first)...)
	var declarers, users []int
	for i := first; i < last; i++ {
		if i%seatEvery == 0 {
			declarers = append(declarers, i)
		} else {
			users = append(users, i)
		}
	}
	var done atomic.Int64
	for _, wave := range [][]int{declarers, users} {
		err := parallel(ctx, len(wave), func(ctx context.Context, k int) error {
			i := wave[k]
			began := time.Now()
			seed, err := f.t.register(ctx, f.op, f.gen.manifest(i))
			if err != nil {
				return fmt.Errorf("module %d of %d: %w", i+2, total, err)
			}
			f.seeds[i] = seed
			f.tookEach[i] = time.Since(began)
			if n := done.Add(1); n%1000 == 0 {
				f.t.log().Info("registered", "modules", n+int64(first)+1, "elapsed", time.Since(start).Round(time.Millisecond))
			}
			return nil
		})
		if err != nil {
			f.n = first + 1 + int(done.Load())
			return err
		}
	}
	f.n = total
	return nil
}

// ConnectAll connects every generated module as it is (sdk.Connect named for it), workers at
// a time, and starts its durable consumer on EVENTS (sdk On its consumes). They stay
// connected until DisconnectAll or Close.
func (f *Fleet) ConnectAll(ctx context.Context) error {
	start := len(f.connected)
	todo := len(f.seeds) - start
	f.connected = append(f.connected, make([]*sdk.Client, todo)...)
	var done atomic.Int64
	began := time.Now()
	return parallel(ctx, todo, func(ctx context.Context, k int) error {
		i := start + k
		cctx, cancel := context.WithTimeout(ctx, requestTimeout)
		defer cancel()
		c, err := sdk.Connect(cctx, f.t.URL, f.seeds[i], sdk.AsModule(f.gen.name(i)))
		if err != nil {
			return fmt.Errorf("connect module %s: %w", f.gen.name(i), err)
		}
		f.connected[i] = c
		if i > 0 {
			if err := c.On(f.gen.consumes(i), func(context.Context, sdk.Event) error { return nil }); err != nil {
				return fmt.Errorf("module %s's consumer: %w", f.gen.name(i), err)
			}
		}
		if n := done.Add(1); n%1000 == 0 {
			f.t.log().Info("connected", "modules", n, "elapsed", time.Since(began).Round(time.Millisecond))
		}
		return nil
	})
}

// Connected is the number of generated modules connected.
func (f *Fleet) Connected() int {
	n := 0
	for _, c := range f.connected {
		if c != nil {
			n++
		}
	}
	return n
}

// DisconnectAll closes the connections ConnectAll made.
func (f *Fleet) DisconnectAll() error {
	var errs []error
	for _, c := range f.connected {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	f.connected = nil
	return errors.Join(errs...)
}

// parallel runs do(ctx, k) for k in [0, n), workers at a time; the first error stops the
// rest.
func parallel(ctx context.Context, n int, do func(ctx context.Context, k int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for k := range n {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error { return do(gctx, k) })
	}
	return g.Wait()
}

// Connects times n connects of the probe each way, in turn: sdk.Connect named for its module,
// sdk.Connect with the seed alone, a raw nkey nats.Connect, and the raw connect with one
// whoami request.
func (f *Fleet) Connects(ctx context.Context, n int) (ConnectSeries, error) {
	if n <= 0 {
		return ConnectSeries{}, errors.New("no connects to make")
	}
	return connects(ctx, f.t, f.probe, f.seed, n)
}

// ConnectSeries are the connects of one Fleet.Connects: see ConnectResult.
type ConnectSeries struct {
	Named, Unnamed, Raw, RawAsk Series
}

// Close closes the fleet's operator connection and its modules' connections; the modules
// stay registered.
func (f *Fleet) Close() error {
	err := f.DisconnectAll()
	if f.op != nil {
		f.op.Close()
	}
	return err
}

// connects times n connects of module each way (see Connects).
func connects(ctx context.Context, t Target, module, seedFile string, n int) (ConnectSeries, error) {
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		return ConnectSeries{}, err
	}
	seed, err := os.ReadFile(seedFile)
	if err != nil {
		return ConnectSeries{}, err
	}
	kp, err := nkeys.ParseDecoratedNKey(seed)
	if err != nil {
		return ConnectSeries{}, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return ConnectSeries{}, err
	}
	whoami, _ := json.Marshal(api.WhoamiRequest{PublicKey: pub})
	rawConnect := func() (*nats.Conn, error) {
		nc, err := nats.Connect(t.URL, opt, nats.CustomInboxPrefix(manifest.InboxPrefix(module)), nats.MaxReconnects(0))
		if err != nil {
			return nil, fmt.Errorf("nats.Connect: %w", err)
		}
		return nc, nil
	}
	sdkConnect := func(opts ...sdk.Option) (time.Duration, error) {
		cctx, cancel := context.WithTimeout(ctx, requestTimeout)
		defer cancel()
		start := time.Now()
		c, err := sdk.Connect(cctx, t.URL, seedFile, opts...)
		d := time.Since(start)
		if err != nil {
			return d, fmt.Errorf("sdk.Connect: %w", err)
		}
		c.Close()
		return d, nil
	}
	// Each connect is timed after another's close, whose end the server is still handling:
	// the order (turns) puts each way after every other as often.
	timed := [4][]time.Duration{}
	ways := [4]func() (time.Duration, error){
		func() (time.Duration, error) { return sdkConnect(sdk.AsModule(module)) },
		func() (time.Duration, error) { return sdkConnect() },
		func() (time.Duration, error) {
			start := time.Now()
			nc, err := rawConnect()
			d := time.Since(start)
			if err == nil {
				nc.Close()
			}
			return d, err
		},
		func() (time.Duration, error) {
			start := time.Now()
			nc, err := rawConnect()
			if err != nil {
				return 0, err
			}
			defer nc.Close()
			m, err := nc.Request(manifest.WhoamiSubject(pub), whoami, requestTimeout)
			d := time.Since(start)
			if err != nil {
				return 0, fmt.Errorf("whoami with nats.go: %w", err)
			}
			var self api.WhoamiReply
			if err := json.Unmarshal(m.Data, &self); err != nil || self.Error != "" || self.Module != module {
				return 0, fmt.Errorf("whoami with nats.go answered %q (%v), not module %s", m.Data, err, module)
			}
			return d, nil
		},
	}
	for _, w := range turns(n) {
		d, err := ways[w]()
		if err != nil {
			return ConnectSeries{}, err
		}
		timed[w] = append(timed[w], d)
	}
	nl, ul, rl, al := timed[0], timed[1], timed[2], timed[3]
	return ConnectSeries{Named: newSeries(nl, sum(nl)), Unnamed: newSeries(ul, sum(ul)), Raw: newSeries(rl, sum(rl)), RawAsk: newSeries(al, sum(al))}, nil
}

// fourWays is an order of 4 ways in which each follows each other exactly once, counting
// the last followed by the first (an Eulerian circuit of the complete directed graph).
var fourWays = []int{0, 1, 2, 3, 0, 2, 1, 3, 2, 0, 3, 1}

// turns is the order of n turns of each of 4 ways: fourWays again and again, a way left out
// once it has had its n. With n a multiple of 3 each way follows every other n/3 times (the
// first turn follows nothing, and one pair n/3-1 times).
func turns(n int) []int {
	had := make([]int, 4)
	var out []int
	for i := 0; len(out) < 4*n; i++ {
		if w := fourWays[i%len(fourWays)]; had[w] < n {
			had[w]++
			out = append(out, w)
		}
	}
	return out
}

// generator writes the manifests of the connect measurement.
type generator struct {
	prefix string // of module names
	seats  string // prefix of seat names
}

func (g generator) name(i int) string { return g.prefix + strconv.Itoa(i) }

func (g generator) seat(i int) string { return g.seats + strconv.Itoa(i/seatEvery) }

func (g generator) probeName() string { return g.prefix + "probe" }

// consumes is what module i > 0 consumes: module i-1's first event.
func (g generator) consumes(i int) string { return g.name(i-1) + ".thing.created" }

// manifest is module i: module 0 first, then 1 …
func (g generator) manifest(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "module: %s\nrequires: [mesh-bus]\nemits: [thing.created, thing.updated]\ntools: [status]\n", g.name(i))
	if i > 0 {
		fmt.Fprintf(&b, "consumes: [%s]\n", g.consumes(i))
	}
	if i%seatEvery == 0 {
		fmt.Fprintf(&b, "seats:\n  %s:\n    scope: mesh\n    retain: 1h\n    accepts: [work]\n    serves: [status]\n", g.seat(i))
	} else {
		fmt.Fprintf(&b, "uses: [%s]\n", g.seat(i))
	}
	return b.String()
}

// probe is the measured module: it emits, consumes, serves and uses module 0's seat.
func (g generator) probe() string {
	return fmt.Sprintf("module: %s\nrequires: [mesh-bus]\nemits: [thing.created]\ntools: [status]\nconsumes: [%s.thing.created]\nuses: [%s]\n",
		g.probeName(), g.name(0), g.seat(0))
}
