package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// seatEvery is how often a generated module declares a seat the following ones use.
const seatEvery = 100

// ConnectResult is the connect measurement: how long a module takes to connect (nkey auth,
// permissions derived from its manifest, and for the sdk the whoami round trip) once the
// registry holds Modules modules, and the same module with only two registered.
type ConnectResult struct {
	// Modules is how many modules were registered.
	Modules int `json:"modules"`
	// Register is the time it took to register them all, one after the other; PerRegister
	// is Register / Modules. In nanoseconds in JSON.
	Register    time.Duration `json:"register_ns"`
	PerRegister time.Duration `json:"per_register_ns"`
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
// with all of them. The modules stay registered: use a throwaway node.
func Connect(ctx context.Context, t Target, modules, connects int) (ConnectResult, error) {
	if modules < 2 {
		return ConnectResult{}, fmt.Errorf("connect needs at least 2 modules, not %d", modules)
	}
	f, err := OpenFleet(ctx, t)
	if err != nil {
		return ConnectResult{}, err
	}
	defer f.Close()
	res := ConnectResult{Modules: modules, Connects: connects}
	few, err := f.Connects(ctx, connects)
	if err != nil {
		return res, err
	}
	res.SDKFew, res.RawFew = few.Named, few.Raw
	t.log().Info("registering modules", "modules", modules)
	if err := f.Grow(ctx, modules); err != nil {
		return res, err
	}
	res.Register = f.Took
	res.PerRegister = f.Took / time.Duration(f.Len())
	t.log().Info("connects", "modules", modules, "connects", connects)
	all, err := f.Connects(ctx, connects)
	if err != nil {
		return res, err
	}
	res.SDK, res.SDKUnnamed, res.Raw, res.RawAsk = all.Named, all.Unnamed, all.Raw, all.RawAsk
	res.Ratio = ratio(float64(res.SDK.P50), float64(res.Raw.P50))
	res.RatioUnnamed = ratio(float64(res.SDKUnnamed.P50), float64(res.Raw.P50))
	res.Floor = ratio(float64(res.RawAsk.P50), float64(res.Raw.P50))
	res.Growth = ratio(float64(res.SDK.P50), float64(res.SDKFew.P50))
	return res, nil
}

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

	// Took is the time spent registering, one module after the other.
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
	if _, err := t.register(ctx, f.op, f.gen.manifest(0)); err != nil {
		f.Close()
		return nil, err
	}
	if f.seed, err = t.register(ctx, f.op, f.gen.probe()); err != nil {
		f.Close()
		return nil, err
	}
	f.Took, f.n, f.probe = time.Since(start), 2, f.gen.probeName()
	return f, nil
}

// Len is the number of modules registered.
func (f *Fleet) Len() int { return f.n }

// Grow registers generated modules until the fleet has total.
func (f *Fleet) Grow(ctx context.Context, total int) error {
	start := time.Now()
	defer func() { f.Took += time.Since(start) }()
	for f.n < total {
		if _, err := f.t.register(ctx, f.op, f.gen.manifest(f.n-1)); err != nil {
			return fmt.Errorf("module %d of %d: %w", f.n+1, total, err)
		}
		f.n++
		if f.n%250 == 0 {
			f.t.log().Info("registered", "modules", f.n, "elapsed", time.Since(start).Round(time.Millisecond))
		}
	}
	return nil
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

// Close closes the fleet's operator connection; the modules stay registered.
func (f *Fleet) Close() error {
	if f.op != nil {
		f.op.Close()
	}
	return nil
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

// manifest is module i: module 0 first, then 1 …
func (g generator) manifest(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "module: %s\nrequires: [mesh-bus]\nemits: [thing.created, thing.updated]\ntools: [status]\n", g.name(i))
	if i > 0 {
		fmt.Fprintf(&b, "consumes: [%s.thing.created]\n", g.name(i-1))
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
