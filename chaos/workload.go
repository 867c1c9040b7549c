package chaos

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/seats"
	meshvault "github.com/meshnode/meshnode/vault"
)

// The workload's modules. pub emits tick; sub consumes it (two instances on two nodes share
// its durable consumer, so each event is the module's to handle once); ledger holds the seat
// ledger (two instances on two nodes compete for it) and applies each job as a fenced effect;
// user submits the jobs.
const (
	pubModule     = "chaos-pub"
	subModule     = "chaos-sub"
	ledgerModule  = "chaos-ledger"
	userModule    = "chaos-user"
	jsModule      = "chaos-js"
	seenEvent     = "seen"
	sleeperModule = "chaos-sleeper"
	ledgerSeat    = "ledger"
	tickEvent     = "tick"
	applyVerb     = "apply"
)

// MaxDeliveries is how often a consuming module may handle one event: chaos-sub's two
// instances each dedup what they handled, and a redelivery (an ack lost to a fault, a
// consumer made again from its last known floor) may reach the other.
const MaxDeliveries = 2

// Deliveries are the bounds of the modules that do not dedup: the Node.js module handles
// every delivery, and an event whose ack was lost in a fault comes again, as often as its
// consumer's MaxDeliver allows (then it is a dead letter).
var Deliveries = map[string]int{jsModule: manifest.MaxDeliver}

// MaxHandles is how often a seat job may be handled: a holder that dies (or is paused past
// its lease) after handling a job and before its ack leaves the job to the next holder, which
// handles it again under a greater epoch — at least once, in fenced order.
const MaxHandles = 2

// WorkloadBounds are what the checks allow a history of this workload: the bounds above, and
// the seats' lease TTL.
func WorkloadBounds() Bounds {
	return Bounds{LeaseTTL: seats.DefaultTTL, MaxDeliveries: MaxDeliveries, Deliveries: Deliveries, MaxHandles: MaxHandles}
}

// Manifests are the workload's modules' manifests, by module.
var Manifests = map[string]string{
	pubModule: "module: " + pubModule + "\nrequires: [mesh-bus]\nemits: [" + tickEvent + "]\n",
	subModule: "module: " + subModule + "\nrequires: [mesh-bus]\nconsumes: [" + pubModule + "." + tickEvent + "]\n",
	ledgerModule: "module: " + ledgerModule + "\nrequires: [mesh-bus]\nseats:\n  " + ledgerSeat +
		":\n    scope: mesh\n    retain: 1h\n    accepts: [" + applyVerb + "]\n",
	userModule:    "module: " + userModule + "\nrequires: [mesh-bus]\nuses: [" + ledgerSeat + "]\n",
	sleeperModule: "module: " + sleeperModule + "\nrequires: [mesh-bus]\n",
	// The plain-NATS Node.js module (examples/node): it answers each tick with a seen.
	jsModule: "module: " + jsModule + "\nrequires: [mesh-bus]\nemits: [" + seenEvent + "]\nconsumes: [" + pubModule + "." + tickEvent + "]\n",
}

// sleeper is the deployed module's artifact: it runs until stopped. Its versions differ only
// in the text, so each deploy is a change every node must apply.
const sleeper = "#!/bin/sh\n# chaos-sleeper %d\nexec sleep 100000\n"

// sleeperVersions is how many versions of it the deploys cycle through.
const sleeperVersions = 3

// Consumers are the EVENTS consumers and SEAT_ streams the workload's modules have: what
// a drift fault may delete under them.
var (
	Consumers = []string{subModule, jsModule}
	Streams   = []string{"SEAT_" + ledgerSeat}
)

// Rates of the workload's clients: an operation each interval, per client.
var (
	EmitEvery     = 150 * time.Millisecond // two emitters: about 13 ticks a second, what the Node.js module handles under faults
	SubmitEvery   = 200 * time.Millisecond
	VaultEvery    = time.Second
	SkewEvery     = 15 * time.Second
	DeployEvery   = 10 * time.Second
	AppliedEvery  = 2 * time.Second // how often each node's applied revision is read
	RegisterEvery = 5 * time.Second
)

// Skews are the offsets the skewed emitter's clock moves through: within the consumers'
// 10-minute replay window, so each of its events must still be handled. (The servers'
// clocks are not offset: Go programs ignore libfaketime and time namespaces do not move the
// wall clock; leases run on monotonic time and JetStream's TTL.)
var Skews = []time.Duration{0, 3 * time.Minute, -3 * time.Minute, 90 * time.Second}

// A Mutation takes out one protection the checkers exist to catch, for a run that shows
// they catch it (TestIntegration_ChaosCheckersCatch); a real run has none.
type Mutation string

// MutateUnfenced removes the ledger holder's stop-on-loss and the receiver's fence: each
// ledger instance goes on applying effects in the epoch it last handled a job in, after it
// lost the seat as before, and the fence accepts every effect without comparing epochs.
const MutateUnfenced Mutation = "unfenced"

// Workload runs the modules' and the operator's operations against a Cluster and records
// each in a History.
type Workload struct {
	c     *Cluster
	log   *slog.Logger
	h     *History
	fence *Fence
	dir   string
	// unfenced is MutateUnfenced.
	unfenced bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// loads are the clients' loops (emits, submits, the operator's writes): StopLoads ends
	// them while the consumers and holders stay connected to catch up.
	loads     context.Context
	stopLoads context.CancelFunc
	loadsWG   sync.WaitGroup

	mu      sync.Mutex
	clients []*sdk.Client
	ops     []*nats.Conn
	secrets []string // names written so far
	regs    atomic.Int64
	js      *JSModule
	skew    atomic.Int64 // the skewed emitter's clock offset, a time.Duration
	skews   atomic.Int64 // how often it moved
}

// StartWorkload registers the workload's modules through the operator, connects their
// instances (placed on different servers: a fault on one leaves the others working), and
// starts every client's loop. Stop ends them. A mutation breaks the workload on purpose.
func StartWorkload(t testing.TB, ctx context.Context, c *Cluster, h *History, dir string, log *slog.Logger, mutations ...Mutation) (*Workload, error) {
	w := &Workload{c: c, log: log, h: h, fence: NewFence(h, ledgerSeat), dir: dir}
	for _, m := range mutations {
		switch m {
		case MutateUnfenced:
			w.unfenced = true
		default:
			return nil, fmt.Errorf("chaos: no mutation %q (there is %q)", m, MutateUnfenced)
		}
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.loads, w.stopLoads = context.WithCancel(w.ctx)
	op, err := w.operator()
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.ops = append(w.ops, op)
	w.mu.Unlock()
	seeds := map[string]string{}
	for module, text := range Manifests {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		reg, err := admin.Register(rctx, op, []byte(text))
		cancel()
		if err != nil {
			w.Stop()
			return nil, fmt.Errorf("register %s: %w", module, err)
		}
		seeds[module] = filepath.Join(dir, module+".nk")
		if err := os.WriteFile(seeds[module], reg.Seed, 0o600); err != nil {
			w.Stop()
			return nil, err
		}
	}
	if err := w.watchLeases(ctx); err != nil {
		w.Stop()
		return nil, err
	}
	n := len(c.Members())
	at := func(i int) int { return c.Members()[i%n] }
	// The ledger's two instances on two servers, in a mesh of three too.
	ledger2 := at(4)
	if ledger2 == at(1) {
		ledger2 = at(2)
	}
	// The seat's user on a server with no ledger instance: a bed that kills the holder's
	// server must not kill the jobs' submitter with it (TestIntegration_ChaosCheckersCatch
	// waited in vain for a new holder's effects, the user gone with the old holder's node).
	user := at(2)
	if user == ledger2 {
		user = at(0)
	}
	place := []struct {
		module string
		node   int
	}{{pubModule, at(0)}, {pubModule, at(2)}, {subModule, at(1)}, {subModule, at(3)},
		{ledgerModule, at(1)}, {ledgerModule, ledger2}, {userModule, user}}
	for k, p := range place {
		var opts []sdk.Option
		if k == 1 {
			// The second emitter's clock is off, by an offset the workload moves (skew).
			opts = append(opts, sdk.WithClock(func() time.Time { return time.Now().Add(time.Duration(w.skew.Load())) }))
		}
		cl, err := w.connect(ctx, p.node, seeds[p.module], opts...)
		if err != nil {
			w.Stop()
			return nil, fmt.Errorf("connect %s to %s: %w", p.module, c.Nodes[p.node].Name(), err)
		}
		switch p.module {
		case pubModule:
			w.loop(EmitEvery, func(i int) { w.emit(cl, i) })
		case subModule:
			// Each instance keeps its handler from running twice on an event (sdk.Dedup), so
			// the module may handle one once per instance: MaxDeliveries.
			dedup := sdk.NewDedup(1 << 16)
			if err := cl.On(pubModule+"."+tickEvent, dedup.Once(func(_ context.Context, e sdk.Event) error {
				w.h.Invoke(subModule, "deliver", e.ID, cl.Instance()).Done(nil)
				return nil
			})); err != nil {
				w.Stop()
				return nil, err
			}
		case ledgerModule:
			if err := w.hold(cl); err != nil {
				w.Stop()
				return nil, err
			}
		case userModule:
			w.loop(SubmitEvery, func(i int) { w.submit(cl, i) })
		}
	}
	js, err := StartJSModule(t, c.Nodes[at(3)].ClientURL(), seeds[jsModule], c.CA(), jsModule, h)
	if err != nil {
		w.Stop()
		return nil, err
	}
	w.js = js
	if err := w.putSleepers(ctx, op); err != nil {
		w.Stop()
		return nil, err
	}
	w.loop(DeployEvery, func(i int) { w.deploy(i) })
	w.loop(AppliedEvery, func(int) { w.readApplied() })
	w.loop(SkewEvery, func(i int) {
		w.skew.Store(int64(Skews[(i+1)%len(Skews)]))
		w.skews.Add(1)
	})
	w.loop(VaultEvery, func(i int) { w.writeSecret(i) })
	w.loop(RegisterEvery, func(i int) { w.register(i) })
	return w, nil
}

// operator connects as the operator through any node that is up.
func (w *Workload) operator() (*nats.Conn, error) {
	return w.c.Connect(nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
}

// operatorAt connects as the operator through node i alone: a read of what that node holds.
func (w *Workload) operatorAt(i int) (*nats.Conn, error) {
	nkey, err := nats.NkeyOptionFromSeed(w.c.OperatorSeed())
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(w.c.Nodes[i].ClientURL(), nkey, sdk.TrustCA(w.c.CA()), nats.CustomInboxPrefix(manifest.OperatorInbox),
		nats.Timeout(5*time.Second), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		return nil, fmt.Errorf("connect as the operator to %s: %w", w.c.Nodes[i].Name(), err)
	}
	return nc, nil
}

// connect connects a module's instance to node i (only i: a module's instance lives with
// its node, and comes back with it).
func (w *Workload) connect(ctx context.Context, i int, seed string, opts ...sdk.Option) (*sdk.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := sdk.Connect(ctx, w.c.Nodes[i].ClientURL(), seed, append([]sdk.Option{sdk.RootCA(w.c.CA()),
		sdk.WithRetryBackoff(100*time.Millisecond, 500*time.Millisecond), sdk.WithLogger(w.log)}, opts...)...)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.clients = append(w.clients, cl)
	w.mu.Unlock()
	return cl, nil
}

// loop calls f(0), f(1), … every interval until the workload stops.
func (w *Workload) loop(every time.Duration, f func(i int)) {
	w.loadsWG.Add(1)
	go func() {
		defer w.loadsWG.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-w.loads.Done():
				return
			case <-t.C:
				f(i)
			}
		}
	}()
}

// emit emits one tick; an error is retried once with the same id (a timeout is not a
// refusal: the first attempt may have been stored, and the id dedups it).
func (w *Workload) emit(cl *sdk.Client, i int) {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	id, err := cl.Emit(ctx, tickEvent, map[string]any{"i": i, "by": cl.Instance()})
	if id == "" {
		return // refused before an id was made: nothing was sent
	}
	op := w.h.Invoke(pubModule, "emit", id, cl.Instance())
	if err != nil {
		_, err = cl.Emit(ctx, tickEvent, map[string]any{"i": i, "by": cl.Instance()}, sdk.Retry(id))
	}
	op.Done(err)
}

// submit submits one ledger job.
func (w *Workload) submit(cl *sdk.Client, i int) {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	id, err := cl.Submit(ctx, ledgerSeat, applyVerb, map[string]int{"i": i})
	if id == "" {
		return
	}
	w.h.Invoke(cl.Instance(), "submit", id, ledgerSeat).Done(err)
}

// hold makes cl a candidate for the ledger seat: each job it handles is applied through
// the fence with the job's epoch.
func (w *Workload) hold(cl *sdk.Client) error {
	if w.unfenced {
		return w.holdUnfenced(cl)
	}
	if err := cl.Accept(applyVerb, func(_ context.Context, j sdk.Job) error {
		op := w.h.Invoke(cl.Instance(), "handle", j.ID, "")
		op.DoneEpoch(j.Epoch, nil)
		if !w.fence.Apply(cl.Instance(), j.ID, j.Epoch) {
			// A stale holder's effect: refused by the receiver, and the job is the new
			// holder's (its ack would be refused too).
			return errors.New("fenced: a newer holder has acted")
		}
		return nil
	}); err != nil {
		return err
	}
	return nil
}

// holdUnfenced is hold under MutateUnfenced: every effect is accepted, and the instance
// goes on applying effects in the epoch of the last job it handled, whether or not it still
// holds the seat.
func (w *Workload) holdUnfenced(cl *sdk.Client) error {
	var epoch atomic.Uint64
	if err := cl.Accept(applyVerb, func(_ context.Context, j sdk.Job) error {
		w.h.Invoke(cl.Instance(), "handle", j.ID, "").DoneEpoch(j.Epoch, nil)
		epoch.Store(j.Epoch)
		w.fence.Force(cl.Instance(), j.ID, j.Epoch)
		return nil
	}); err != nil {
		return err
	}
	w.loop(SubmitEvery, func(i int) {
		if e := epoch.Load(); e > 0 {
			w.fence.Force(cl.Instance(), fmt.Sprintf("%s-after-%d", cl.Instance(), i), e)
		}
	})
	return nil
}

// putSleepers stores the sleeper's versions as artifacts.
func (w *Workload) putSleepers(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	obs, err := artifact.Lookup(ctx, js)
	if err != nil {
		return fmt.Errorf("the artifacts' store: %w", err)
	}
	for v := 1; v <= sleeperVersions; v++ {
		path := filepath.Join(w.dir, fmt.Sprintf("sleeper-%d", v))
		if err := os.WriteFile(path, fmt.Appendf(nil, sleeper, v), 0o755); err != nil {
			return err
		}
		if _, err := artifact.Put(ctx, obs, sleeperModule, strconv.Itoa(v), path); err != nil {
			return fmt.Errorf("store %s version %d: %w", sleeperModule, v, err)
		}
	}
	return nil
}

// deploy deploys the next version of the sleeper on every node (--all).
func (w *Workload) deploy(i int) {
	nc, err := w.operator()
	if err != nil {
		return
	}
	defer nc.Close()
	version := strconv.Itoa(i%sleeperVersions + 1)
	ctx, cancel := context.WithTimeout(w.ctx, 20*time.Second)
	defer cancel()
	op := w.h.Invoke("operator", "deploy", sleeperModule, version)
	_, err = admin.Deploy(ctx, nc, api.DeployRequest{Module: sleeperModule, Deployment: api.Deployment{Version: version, All: true, Instances: 1}})
	op.Done(err)
}

// readApplied records each running node's applied declaration revision, as the node itself
// says (GET /v1/status): what it applied, kept across its restarts.
func (w *Workload) readApplied() {
	client := w.c.HTTPClient(2 * time.Second)
	for _, i := range w.c.Members() {
		n := w.c.Nodes[i]
		invoked := time.Now()
		resp, err := client.Get(n.HTTPURL() + "/v1/status")
		if err != nil {
			continue
		}
		var st api.NodeStatus
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil || st.AppliedRevision == 0 {
			continue
		}
		w.h.At(n.Name(), "applied", n.Name(), strconv.FormatUint(st.AppliedRevision, 10), invoked).Done(nil)
	}
}

// writeSecret gives secret chaos-<i mod 4> a new value (mint the first time, rotate after).
func (w *Workload) writeSecret(i int) {
	name := "chaos-" + strconv.Itoa(i%4)
	value := rand.Text() // random, and long enough for ScanPlaintext to tell it in a file
	nc, err := w.operator()
	if err != nil {
		return
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	verb := api.VaultVerbRotate
	if i < 4 {
		verb = api.VaultVerbMint
	}
	op := w.h.Invoke("operator", "vault-write", name, value)
	req := api.VaultRequest{Owner: api.VaultCallerOperator, Name: name}
	if verb == api.VaultVerbRotate {
		req.Grace = "1m"
	}
	if err := meshvault.Give(ctx, nc, api.VaultCallerOperator, &req, []byte(value)); err != nil {
		op.Done(err)
		return
	}
	var s api.Secret
	_, err = meshvault.Call(ctx, nc, verb, api.VaultCallerOperator, req, &s)
	op.Done(err)
	if err == nil && verb == api.VaultVerbMint {
		w.mu.Lock()
		w.secrets = append(w.secrets, name)
		w.mu.Unlock()
	}
}

// register registers one more module, through a node the index picks.
func (w *Workload) register(i int) {
	nc, err := w.operator()
	if err != nil {
		return
	}
	defer nc.Close()
	module := "chaos-r" + strconv.Itoa(i)
	ctx, cancel := context.WithTimeout(w.ctx, 20*time.Second)
	defer cancel()
	op := w.h.Invoke("operator", "register", module, "")
	_, err = admin.Register(ctx, nc, []byte("module: "+module+"\nrequires: [mesh-bus]\nemits: [x]\n"))
	op.Done(err)
	if err == nil {
		w.regs.Add(1)
	}
}

// StopLoads ends the loops that invoke operations; consumers, holders and the lease watch
// go on, so Final can wait for them to catch up.
func (w *Workload) StopLoads() {
	if w.stopLoads != nil {
		w.stopLoads()
	}
	w.loadsWG.Wait()
}

// Stop ends every loop and closes every client.
func (w *Workload) Stop() {
	w.StopLoads()
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, cl := range w.clients {
		cl.Close()
	}
	if w.js != nil {
		w.js.Stop()
	}
	for _, nc := range w.ops {
		nc.Close()
	}
	w.clients, w.ops = nil, nil
}

// eventIDs reads the ids of every tick EVENTS holds, through node i.
func (w *Workload) eventIDs(ctx context.Context, i int) (map[string]bool, error) {
	nc, err := w.operatorAt(i)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var subjects []string
	for _, e := range []string{pubModule + "." + tickEvent, jsModule + "." + seenEvent} {
		subject, err := manifest.ConsumeSubject(e)
		if err != nil {
			return nil, err
		}
		subjects = append(subjects, subject)
	}
	cons, err := js.OrderedConsumer(ctx, manifest.EventsStreamName, jetstream.OrderedConsumerConfig{FilterSubjects: subjects})
	if err != nil {
		return nil, fmt.Errorf("read EVENTS through %s: %w", w.c.Nodes[i].Name(), err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			ids[m.Headers().Get(envelope.EventID)] = true
			got++
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if got == 0 {
			return nil, fmt.Errorf("EVENTS stopped answering with %d ticks unread", pending)
		}
		pending -= uint64(got)
	}
	return ids, nil
}

// auditIDs reads the ids of every tick node i's audit log recorded.
func (w *Workload) auditIDs(ctx context.Context, i int) (map[string]bool, error) {
	nc, err := w.operatorAt(i)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ids := map[string]bool{}
	for _, source := range []string{pubModule, jsModule} {
		f := api.AuditFilter{Source: source, Limit: api.AuditDefaultLimit * 5}
		for {
			reply, err := audit.Call(ctx, nc, w.c.Nodes[i].Name(), api.AuditRequest{Op: "query", Filter: f})
			if err != nil {
				return nil, fmt.Errorf("audit query on %s: %w", w.c.Nodes[i].Name(), err)
			}
			for _, r := range reply.Records {
				ids[r.EventID] = true
			}
			if len(reply.Records) < f.Limit {
				break
			}
			f.After = reply.Records[len(reply.Records)-1].N
		}
	}
	return ids, nil
}

// readSecrets fetches every secret written, through node i.
func (w *Workload) readSecrets(ctx context.Context, i int) (map[string]string, error) {
	nc, err := w.operatorAt(i)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	w.mu.Lock()
	names := append([]string(nil), w.secrets...)
	w.mu.Unlock()
	out := map[string]string{}
	for _, name := range names {
		var s api.Secret
		if _, err := meshvault.Call(ctx, nc, api.VaultVerbFetch, api.VaultCallerOperator, api.VaultRequest{Owner: api.VaultCallerOperator, Name: name}, &s); err != nil {
			return nil, fmt.Errorf("fetch %s through %s: %w", name, w.c.Nodes[i].Name(), err)
		}
		out[name] = s.Value
	}
	return out, nil
}

// watchLeases records the ledger seat's lease history as the leases' bucket holds it: a new
// epoch is an acquire, the same one again a renewal (seats renew at the expected revision,
// so a renewal proves possession), a deletion a release. Each is invoked when the bucket
// stored it (the stream leader's clock: every node of the cluster shares this machine's) and
// completes when the watch saw it.
//
// The bucket keeps one revision a key, and the watch's consumer is made again from the
// revision after its last when the server that ran it stops: a revision written meanwhile
// and already replaced (a release, then the next holder's acquire) is never seen. The watch
// follows every key so that it knows: a revision it skipped, once it is live, may have freed
// the ledger's lease, so the holder then is recorded as losing it some time after the last
// revision seen — unknown when, which is all the history can say (a lose that never
// completes; see lease.go).
func (w *Workload) watchLeases(ctx context.Context) error {
	nc, err := w.operator()
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.ops = append(w.ops, nc)
	w.mu.Unlock()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	kv, err := js.KeyValue(ctx, seats.Bucket)
	if err != nil {
		return fmt.Errorf("open the leases' bucket: %w", err)
	}
	key := seats.Key(ledgerSeat, manifest.ScopeMesh, "")
	watch, err := kv.WatchAll(w.ctx, jetstream.IncludeHistory())
	if err != nil {
		return fmt.Errorf("watch the leases' bucket: %w", err)
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer watch.Stop()
		var holder string
		var epoch uint64
		var live bool        // the history so far was delivered: from now on no revision is skipped unless missed
		var last uint64      // the last revision seen, of any key
		var lastAt time.Time // when it was stored
		for {
			var e jetstream.KeyValueEntry
			select {
			case <-w.ctx.Done():
				return
			case e = <-watch.Updates():
			}
			if e == nil {
				live = true
				continue
			}
			if live && holder != "" && e.Revision() > last+1 {
				w.h.Maybe(holder, "lose", ledgerSeat, fmt.Sprintf("revisions %d–%d not seen", last+1, e.Revision()-1), epoch, lastAt)
			}
			last, lastAt = e.Revision(), e.Created()
			if e.Key() != key {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				if holder != "" {
					w.h.At(holder, "release", ledgerSeat, "", e.Created()).DoneEpoch(epoch, nil)
				}
				holder, epoch = "", 0
				continue
			}
			var l seats.Lease
			if json.Unmarshal(e.Value(), &l) != nil {
				continue
			}
			if l.Epoch == 0 {
				l.Epoch = e.Revision() // the creating write: its revision is the epoch
			}
			kind := "renew"
			if l.Instance != holder || l.Epoch != epoch {
				kind = "acquire"
			}
			w.h.At(l.Instance, kind, ledgerSeat, l.Node, e.Created()).DoneEpoch(l.Epoch, nil)
			holder, epoch = l.Instance, l.Epoch
		}
	}()
	return nil
}

// finalMost bounds Final's wait for the consumers, however steadily they progress.
const finalMost = 10 * time.Minute

// Final reads, after healing, what the checkers judge the history against: EVENTS' ticks,
// each node's audit log, each node's view of the vault, and each data dir's files scanned
// for secrets in plaintext. It first waits for the consumers to have every acked tick and
// the seat's holder every job, for as long as they keep progressing: it gives up once stall
// passes with no more of them had (or after finalMost). A consumer that lost an event
// stalls; one slowly working off a backlog the faults left is waited for — the Node.js
// module in the 30-minute run was still 140 s behind 90 s after the loads stopped, and
// catching up. Then it waits up to stall for each audit log to hold every acked event.
func (w *Workload) Final(ctx context.Context, stall time.Duration) (Final, error) {
	f := Final{Audit: map[string][]string{}, Consumers: Consumers, Vault: map[string]map[string]string{},
		Plaintext: map[string][]string{}, Sources: map[string][]string{subModule: {pubModule}, jsModule: {pubModule}}}
	ops := w.h.Ops()
	acked := map[string]bool{}
	for _, op := range ops {
		if op.Kind == "emit" && op.OK {
			acked[op.Key] = true
		}
	}
	ackedBy := map[string]string{}
	for _, op := range ops {
		if op.Kind == "emit" && op.OK {
			ackedBy[op.Key] = op.Process
		}
	}
	missingOf := func(have map[string]bool, source string) int {
		n := 0
		for id, by := range ackedBy {
			if by == source && !have[id] {
				n++
			}
		}
		return n
	}
	var wiped time.Duration // the end of the last deletion of the seat's queue: jobs before it may be gone
	for _, op := range ops {
		if op.Kind == "wipe" && op.CompleteMono > wiped {
			wiped = op.CompleteMono
		}
	}
	submitted := map[string]bool{}
	for _, op := range ops {
		if op.Kind == "submit" && op.OK && op.InvokeMono >= wiped {
			submitted[op.Key] = true
		}
	}
	missingJobs := func(handled map[string]bool) int {
		n := 0
		for id := range submitted {
			if !handled[id] {
				n++
			}
		}
		return n
	}
	missing := func(have map[string]bool) int {
		n := 0
		for id := range acked {
			if !have[id] {
				n++
			}
		}
		return n
	}
	start := time.Now()
	most := start.Add(finalMost)
	progressed, fewest := start, -1
	for time.Now().Before(most) && time.Since(progressed) < stall {
		delivered := map[string]map[string]bool{subModule: {}, jsModule: {}}
		for _, op := range w.h.Ops() {
			if op.Kind == "deliver" && delivered[op.Process] != nil {
				delivered[op.Process][op.Key] = true
			}
		}
		handled := map[string]bool{}
		for _, op := range w.h.Ops() {
			if op.Kind == "handle" {
				handled[op.Key] = true
			}
		}
		left := missingOf(delivered[subModule], pubModule) + missingOf(delivered[jsModule], pubModule) + missingJobs(handled)
		if left == 0 {
			break
		}
		if fewest < 0 || left < fewest {
			progressed, fewest = time.Now(), left
		}
		time.Sleep(500 * time.Millisecond) // the consumers' pace, not a state: polled
	}
	f.CatchUp = time.Since(start)
	deadline := time.Now().Add(stall)
	// The Node.js module answers each tick with an event of its own: stopped now, it emits
	// none after EVENTS and the audit logs are read.
	if w.js != nil {
		w.js.Stop()
	}
	ops = w.h.Ops()
	for _, op := range ops {
		if op.Kind == "emit" && op.OK {
			acked[op.Key] = true
		}
	}
	var err error
	var events map[string]bool
	for _, i := range w.c.Members() {
		if events, err = w.eventIDs(ctx, i); err == nil {
			break
		}
	}
	if err != nil {
		return f, err
	}
	f.Events = sortedKeys(events)
	for _, i := range w.c.Members() {
		n := w.c.Nodes[i]
		f.Nodes = append(f.Nodes, n.Name())
		var ids map[string]bool
		for {
			ids, err = w.auditIDs(ctx, i)
			if err == nil && missing(ids) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond) // the audit log's pace: polled
		}
		if err != nil {
			return f, err
		}
		f.Audit[n.Name()] = sortedKeys(ids)
		if f.Vault[n.Name()], err = w.readSecrets(ctx, i); err != nil {
			return f, err
		}
		if f.Plaintext[n.Name()], err = ScanPlaintext(n.DataDir(), ops); err != nil {
			return f, err
		}
	}
	// Every node applies the newest declaration published for it.
	f.Revisions, f.Declared = map[string]uint64{}, map[string]uint64{}
	for {
		err = w.readRevisions(ctx, f.Revisions, f.Declared)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond) // the nodes' reports' pace: polled
	}
	return f, nil
}

// readRevisions reads each node's applied and declared revision from ps, and says which node
// is behind.
func (w *Workload) readRevisions(ctx context.Context, applied, declared map[string]uint64) error {
	nc, err := w.operator()
	if err != nil {
		return err
	}
	defer nc.Close()
	ps, err := admin.Ps(ctx, nc)
	if err != nil {
		return err
	}
	clear(applied)
	clear(declared)
	for _, p := range ps {
		if p.Module == sleeperModule {
			applied[p.Node], declared[p.Node] = p.Revision, p.Declared
		}
	}
	for _, i := range w.c.Members() {
		name := w.c.Nodes[i].Name()
		if applied[name] == 0 || applied[name] != declared[name] {
			return fmt.Errorf("node %s applied revision %d of %d", name, applied[name], declared[name])
		}
	}
	return nil
}

// ClockSkews is how often the skewed emitter's clock moved.
func (w *Workload) ClockSkews() int { return int(w.skews.Load()) }

// JSLog is the end of the Node.js module's output.
func (w *Workload) JSLog() string {
	if w.js == nil {
		return ""
	}
	return w.js.Log()
}
