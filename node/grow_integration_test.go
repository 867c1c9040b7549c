//go:build integration

package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// restartingNode runs a node the way `meshnode run` does: opened again on its data dir
// whenever Run ends with node.ErrRestart (a single node growing into a mesh).
type restartingNode struct {
	mu      sync.Mutex
	n       *node.Node
	opened  chan struct{} // each open, once it is done
	cancel  context.CancelFunc
	done    chan error
	restart int
	// interrupted counts the opens cut short.
	interrupted int
}

// runRestarting runs the node on cfg. With interrupt set, the first open that reaches a
// phase beginning with it is cut short there (its context cancelled, as a stop would), and
// the node is opened again.
func runRestarting(t *testing.T, cfg config.Config, interrupt string) *restartingNode {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &restartingNode{opened: make(chan struct{}, 8), cancel: cancel, done: make(chan error, 1)}
	go func() {
		for {
			n := node.New(cfg, testLog())
			octx, cut := context.WithCancel(ctx)
			var interrupted bool
			n.OnPhase = func(phase string) {
				if interrupt != "" && strings.HasPrefix(phase, interrupt) {
					interrupt, interrupted = "", true
					cut()
				}
			}
			err := n.OpenContext(octx)
			cut()
			if err != nil && interrupted && ctx.Err() == nil {
				r.mu.Lock()
				r.interrupted++
				r.mu.Unlock()
				continue
			}
			if err != nil {
				r.done <- fmt.Errorf("open %s: %w", cfg.Name, err)
				return
			}
			r.mu.Lock()
			r.n = n
			r.mu.Unlock()
			r.opened <- struct{}{}
			err = n.Run(ctx)
			n.Close()
			if errors.Is(err, node.ErrRestart) {
				r.mu.Lock()
				r.restart++
				r.mu.Unlock()
				continue
			}
			r.done <- err
			return
		}
	}()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func (r *restartingNode) node() *node.Node {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// awaitOpen waits for the node's next open.
func (r *restartingNode) awaitOpen(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-r.opened:
	case err := <-r.done:
		r.done <- err
		t.Fatalf("the node ended: %v", err)
	case <-time.After(within):
		t.Fatalf("the node did not open within %s", within)
	}
}

// TestIntegration_Grow_OneToThree: a single node with three registered modules, five secrets, 10,020
// events, 100 jobs queued for a seat nobody holds and an audit log of it all grows into a
// mesh of three — `grow` on it, `join` with its token on two new nodes — and after it every
// stream holds what it held (counts, sequences, sampled contents), at 3 replicas; the
// module's credential and secret work through a new node; the grown node's audit log
// verifies; and with one of the three stopped, events, jobs and secrets all still read.
func TestIntegration_Grow_OneToThree(t *testing.T) { testGrow(t, "") }

// TestIntegration_Grow_Interrupted: the growing node's start is cut short while it restores EVENTS;
// the next start goes on from there, and the mesh ends up whole.
func TestIntegration_Grow_Interrupted(t *testing.T) { testGrow(t, "growing: restoring EVENTS") }

// TestIntegration_Grow_InterruptedSnapshot: cut short as it takes its snapshots, the growing node
// starts over from its untouched store.
func TestIntegration_Grow_InterruptedSnapshot(t *testing.T) {
	testGrow(t, "growing: taking a snapshot")
}

func testGrow(t *testing.T, interrupt string) {
	// Every client port TLS, as off loopback: the new nodes enrol through it with the CA
	// their token carries.
	cfgA := clusterConfig(t, "a")
	// 10,000 events as fast as a raw client sends them: none refused for its pace, nor the
	// client barred for its rate (flood-rate's bursts are a quarter second's worth).
	cfgA.EmitRate, cfgA.FloodRate = 0, 0
	cfgA.ClientTLS = "always"
	if _, _, err := datadir.Prepare(cfgA, 1); err != nil {
		t.Fatal(err)
	}
	a := runRestarting(t, cfgA, interrupt)
	a.awaitOpen(t, 30*time.Second)
	ca := filepath.Join(cfgA.DataDir, meshca.CAFile)
	op := connect(t, a.node().ClientURL(), filepath.Join(cfgA.DataDir, datadir.OperatorSeedFile), nats.CustomInboxPrefix(manifest.OperatorInbox), sdk.TrustCA(ca))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := admin.Register(ctx, op, []byte("module: mailer\nrequires: [mesh-bus]\nseats:\n  mail: {scope: mesh, retain: 1d, accepts: [send]}\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Register(ctx, op, []byte("module: billing\nrequires: [mesh-bus]\nsecrets: [k1, k2, k3, k4]\n")); err != nil {
		t.Fatal(err)
	}
	minted := map[string]string{}
	for _, k := range []string{"k1", "k2", "k3", "k4"} {
		var m api.Secret
		if _, err := vault.Call(ctx, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "billing", Name: k}, &m); err != nil {
			t.Fatal(err)
		}
		minted[k] = m.Value
	}
	reg, err := admin.Register(ctx, op, []byte("module: shop\nrequires: [mesh-bus]\nemits: [sold]\nsecrets: [key]\nuses: [mail]\n"))
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(t.TempDir(), "shop.nk")
	if err := os.WriteFile(seed, reg.Seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := vault.Call(ctx, op, api.VaultVerbMint, api.VaultCallerOperator, api.VaultRequest{Owner: "shop", Name: "key"}, nil); err != nil {
		t.Fatal(err)
	}
	shop, err := sdk.Connect(ctx, a.node().ClientURL(), seed, sdk.RootCA(ca))
	if err != nil {
		t.Fatal(err)
	}
	secret, err := shop.Secret(ctx, "key")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := shop.Emit(ctx, "sold", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	// 100 jobs wait in the seat's queue, its holder not running.
	for i := range 100 {
		if _, err := shop.Submit(ctx, "mail", "send", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	shop.Close()
	events := 20
	if interrupt == "" {
		events += emitMany(t, ctx, a.node().ClientURL(), seed, ca, 10000)
	}
	js, _ := jetstream.New(op)
	sample := sampleEvents(t, ctx, js)
	// The audit log has every event before the node grows.
	retryUntil(t, 60*time.Second, func() error {
		if st := a.node().Status(ctx); st.Audit.Lag != 0 || st.Audit.Records < uint64(events) {
			return fmt.Errorf("audit: %+v", st.Audit)
		}
		return nil
	})
	before := streamStates(t, ctx, js)
	beforeDurables, err := durables(ctx, js, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := beforeDurables["SEAT_mail > seat-mail"]; !ok || len(beforeDurables) < 3 {
		t.Fatalf("durable consumers before growing: %v", beforeDurables)
	}
	if before["EVENTS"].State.Msgs < 20 {
		t.Fatalf("EVENTS holds %d messages before growing", before["EVENTS"].State.Msgs)
	}

	// grow, then a token for the two new servers.
	body, _ := json.Marshal(api.GrowRequest{Expect: 3})
	msg, err := op.RequestWithContext(ctx, manifest.NodeToolSubject("a", api.NodeToolGrow), body)
	if err != nil || !strings.Contains(string(msg.Data), `"ok":true`) {
		t.Fatalf("grow: %v %s", err, msgData(msg))
	}
	var tok api.Token
	if _, err := vault.Call(ctx, op, api.VaultVerbToken, api.VaultCallerOperator, api.VaultRequest{TTL: "1h", Uses: 2}, &tok); err != nil {
		t.Fatal(err)
	}
	op.Close()
	if got := a.node().Growing(); !strings.Contains(got, "waiting for 2 more") {
		t.Fatalf("growing %q, want it waiting for 2 more", got)
	}
	growing := time.Now()
	var joined []*restartingNode
	for _, name := range []string{"b", "c"} {
		cfg := clusterConfig(t, name)
		cfg.ClientTLS = "always"
		if _, err := node.Join(ctx, cfg, tok.Token); err != nil {
			t.Fatalf("join %s: %v", name, err)
		}
		joined = append(joined, runRestarting(t, cfg, ""))
	}
	// a restarts, migrates and opens again; b and c open once it has.
	a.awaitOpen(t, 2*time.Minute)
	for _, j := range joined {
		j.awaitOpen(t, 2*time.Minute)
	}
	t.Logf("grew %d events, 100 queued jobs and 5 secrets into a mesh of three in %s (from the joins to all three open)", events, time.Since(growing).Round(time.Millisecond))

	op = connect(t, joined[0].node().ClientURL(), filepath.Join(cfgA.DataDir, datadir.OperatorSeedFile), nats.CustomInboxPrefix(manifest.OperatorInbox), sdk.TrustCA(ca))
	defer op.Close()
	js, _ = jetstream.New(op)
	after := streamStates(t, ctx, js)
	for name, was := range before {
		now, ok := after[name]
		if !ok {
			t.Errorf("stream %s is gone", name)
			continue
		}
		st, got := was.State, now.State
		// The streams go on (the new servers' events and records, leases renewed, jobs
		// taken): none goes back, and what EVENTS and the vault held is all still there.
		kept := (name == "EVENTS" || name == "KV_mesh-vault") && got.FirstSeq != st.FirstSeq
		if kept || got.LastSeq < st.LastSeq {
			t.Errorf("stream %s: sequences %d–%d, before %d–%d", name, got.FirstSeq, got.LastSeq, st.FirstSeq, st.LastSeq)
		}
		if r := now.Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, r)
		}
		if _, marked := now.Config.Metadata["meshnode.restoring"]; marked {
			t.Errorf("stream %s is still marked as restoring", name)
		}
	}
	// Every durable consumer came along, on 3 replicas, its acks kept (a seat's queue kept
	// on the growing server alone would go with it; one restored empty would deliver again).
	retryUntil(t, 30*time.Second, func() error { // those made since (the new nodes' audit) may be electing
		after, err := durables(ctx, js, true)
		if err != nil {
			return err
		}
		for c, floor := range beforeDurables {
			got, ok := after[c]
			if !ok {
				return fmt.Errorf("consumer %s is gone", c)
			}
			if got < floor {
				t.Fatalf("consumer %s: ack floor %d, was %d before growing", c, got, floor)
			}
		}
		return nil
	})
	if _, err := admin.List(ctx, op); err != nil {
		t.Fatalf("module ls after growing: %v", err)
	}
	shop, err = sdk.Connect(ctx, joined[1].node().ClientURL(), seed, sdk.RootCA(ca))
	if err != nil {
		t.Fatalf("the module's credential through a new server: %v", err)
	}
	defer shop.Close()
	got, err := shop.Secret(ctx, "key")
	if err != nil || string(got) != string(secret) {
		t.Fatalf("the module's secret after growing: %q %v", got, err)
	}
	if _, err := shop.Emit(ctx, "sold", map[string]int{"n": 99}); err != nil {
		t.Fatalf("emit after growing: %v", err)
	}
	a.mu.Lock()
	interrupted := a.interrupted
	a.mu.Unlock()
	if interrupt != "" && interrupted != 1 {
		t.Errorf("the growing node was interrupted %d times, want once", interrupted)
	}
	if g := a.node().Growing(); g != "" {
		t.Errorf("still growing: %q", g)
	}
	if members := a.node().Members(); len(members) != 3 {
		t.Errorf("members %+v, want 3", members)
	}
	reply, err := audit.Call(ctx, op, "a", api.AuditRequest{Op: "verify"})
	if err != nil || reply.Verification == nil || !reply.Verification.OK() || reply.Verification.Records < uint64(events) {
		t.Errorf("the grown node's audit log: %+v %v", reply.Verification, err)
	}
	// With one of the three gone, everything still reads.
	joined[0].cancel()
	<-joined[0].done
	joined[0].done <- nil // for the cleanup
	op2 := connect(t, joined[1].node().ClientURL(), filepath.Join(cfgA.DataDir, datadir.OperatorSeedFile), nats.CustomInboxPrefix(manifest.OperatorInbox), sdk.TrustCA(ca))
	defer op2.Close()
	js2, _ := jetstream.New(op2)
	// The stopped node's leaderships move (nats-server elects in 4–9 s) and so do its seats.
	retryUntil(t, 90*time.Second, func() error {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		defer rcancel()
		stream, err := js2.Stream(rctx, "EVENTS")
		if err != nil {
			return fmt.Errorf("EVENTS: %w", err)
		}
		for seq, body := range sample {
			m, err := stream.GetMsg(rctx, seq)
			if err != nil {
				return fmt.Errorf("event %d: %w", seq, err)
			}
			if string(m.Data) != body {
				t.Fatalf("event %d reads %q after growing, was %q", seq, m.Data, body)
			}
		}
		st, err := js2.Stream(rctx, "SEAT_mail")
		if err != nil {
			return fmt.Errorf("SEAT_mail: %w (each server's view: %s)", err, streamViews(t, joined[1].node().ClientURL(), filepath.Join(cfgA.DataDir, datadir.OperatorSeedFile), ca, "SEAT_mail"))
		}
		if n := st.CachedInfo().State.Msgs; n != 100 {
			t.Fatalf("the seat's queue holds %d jobs, want 100", n)
		}
		for _, k := range []string{"k1", "k2", "k3", "k4"} {
			var got api.Secret
			if _, err := vault.Call(rctx, op2, api.VaultVerbFetch, api.VaultCallerOperator, api.VaultRequest{Owner: "billing", Name: k}, &got); err != nil {
				return fmt.Errorf("secret %s: %w", k, err)
			}
			if got.Value != minted[k] {
				t.Fatalf("secret %s reads %q after growing, was minted %q", k, got.Value, minted[k])
			}
		}
		return nil
	})
	// What the mesh said of its growth — the new servers joining, seats moving, a server
	// stopping — is genuine in the audit log of the server still running.
	retryUntil(t, 30*time.Second, func() error {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		defer rcancel()
		reply, err := audit.Call(rctx, op2, joined[1].node().Identity().Name, api.AuditRequest{Op: "verify"})
		if err != nil {
			return err
		}
		if v := reply.Verification; v == nil || v.Broken != nil || v.FlaggedTotal != 0 {
			return fmt.Errorf("audit verify on %s: %+v", joined[1].node().Identity().Name, v)
		}
		return nil
	})
}

// streamStates is every stream's info, by name.
//
// Each stream is asked for itself, again until it answers: a clustered stream list leaves
// out a stream whose leader does not answer in time (nats-server's "missing", which
// nats.go's jetstream does not report), and a grown mesh's leaders may still be electing.
func streamStates(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]*jetstream.StreamInfo {
	t.Helper()
	out := map[string]*jetstream.StreamInfo{}
	retryUntil(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // one unanswered request must not hold a retry
		defer cancel()
		names := js.StreamNames(ctx)
		for name := range names.Name() {
			if _, ok := out[name]; ok {
				continue
			}
			st, err := js.Stream(ctx, name)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				continue // deleted since it was listed
			}
			if err != nil {
				return fmt.Errorf("stream %s: %w", name, err)
			}
			out[name] = st.CachedInfo()
		}
		return names.Err()
	})
	return out
}

// durables returns each stream's durable consumers ("STREAM > name") with their ack floor,
// each asked for itself (a consumer list leaves out a consumer without a leader); with
// whole, each must have a leader and 2 current replicas.
func durables(ctx context.Context, js jetstream.JetStream, whole bool) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // one unanswered request must not hold a retry
	defer cancel()
	out := map[string]uint64{}
	streams := js.StreamNames(ctx)
	var names []string
	for name := range streams.Name() {
		names = append(names, name)
	}
	if err := streams.Err(); err != nil {
		return nil, err
	}
	for _, name := range names {
		st, err := js.Stream(ctx, name)
		if err != nil {
			return nil, err
		}
		lister := st.ConsumerNames(ctx)
		var consumers []string
		for c := range lister.Name() {
			consumers = append(consumers, c)
		}
		if err := lister.Err(); err != nil {
			return nil, fmt.Errorf("%s's consumers: %w", name, err)
		}
		for _, c := range consumers {
			cons, err := st.Consumer(ctx, c)
			if errors.Is(err, jetstream.ErrNotPullConsumer) {
				continue // a watcher's: ephemeral
			}
			if err != nil {
				return nil, fmt.Errorf("%s > %s: %w", name, c, err)
			}
			info := cons.CachedInfo()
			if info.Config.Durable == "" {
				continue
			}
			if cl := info.Cluster; whole && (cl == nil || cl.Leader == "" || len(cl.Replicas) != 2 ||
				slices.ContainsFunc(cl.Replicas, func(p *jetstream.PeerInfo) bool { return !p.Current })) {
				return nil, fmt.Errorf("%s > %s: cluster %+v, want a leader and 2 current replicas", name, c, cl)
			}
			out[name+" > "+c] = info.AckFloor.Stream
		}
	}
	return out, nil
}

// emitMany publishes n signed events of the shop module at once (pipelined, as a module
// may) and returns n.
func emitMany(t *testing.T, ctx context.Context, url, seed, ca string, n int) int {
	t.Helper()
	raw, err := os.ReadFile(seed)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.ParseDecoratedNKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	sk, _ := envelope.NewSigningKey(kp)
	nc := connect(t, url, seed, nats.CustomInboxPrefix(manifest.InboxPrefix("shop")), sdk.TrustCA(ca))
	defer nc.Close()
	// A bounded window of 512 unacknowledged: a publish at the window waits for an ack as
	// long as the test would (the client's default 200 ms failed the test on a busy machine:
	// "stalled with too many outstanding async published messages").
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(512))
	stall := jetstream.WithStallWait(30 * time.Second)
	subject := manifest.EventSubject("shop", "sold")
	for i := range n {
		body := []byte(fmt.Sprintf(`{"n":%d}`, i))
		h, err := envelope.Stamp(sk, "shop", "a", subject, body, envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsgAsync(&nats.Msg{Subject: manifest.AdmitSubject("shop", subject), Header: h, Data: body}, stall); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("the events were not all acknowledged")
	}
	return n
}

// sampleEvents is a few of EVENTS' messages by sequence — first, middle, last — with
// their bodies.
func sampleEvents(t *testing.T, ctx context.Context, js jetstream.JetStream) map[uint64]string {
	t.Helper()
	st, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	info := st.CachedInfo().State
	out := map[uint64]string{}
	for _, seq := range []uint64{info.FirstSeq, (info.FirstSeq + info.LastSeq) / 2, info.LastSeq} {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		out[seq] = string(m.Data)
	}
	return out
}

// streamViews is what every server says of stream name (its leader, its replicas and how
// current each is, its raft group), asked through the system account: what a stream that
// does not answer needs to be told apart.
func streamViews(t *testing.T, url, seed, ca, name string) string {
	t.Helper()
	nc := connect(t, url, seed, nats.Name(embedbus.SystemConnection), sdk.TrustCA(ca))
	defer nc.Close()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return err.Error()
	}
	defer sub.Unsubscribe()
	req, _ := json.Marshal(server.JSzOptions{Accounts: true, Streams: true, RaftGroups: true})
	if err := nc.PublishRequest("$SYS.REQ.SERVER.PING.JSZ", inbox, req); err != nil {
		return err.Error()
	}
	var views []string
	for {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			break
		}
		var resp server.ServerAPIJszResponse
		if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Data == nil {
			views = append(views, fmt.Sprintf("unreadable %q", m.Data))
			continue
		}
		view := resp.Server.Name + ": not placed here"
		for _, acc := range resp.Data.AccountDetails {
			for _, sd := range acc.Streams {
				if sd.Name == name {
					b, _ := json.Marshal(struct {
						Cluster any    `json:"cluster"`
						Group   string `json:"raft_group"`
						Msgs    uint64 `json:"msgs"`
						Last    uint64 `json:"last_seq"`
					}{sd.Cluster, sd.RaftGroup, sd.State.Msgs, sd.State.LastSeq})
					view = resp.Server.Name + ": " + string(b)
				}
			}
		}
		views = append(views, view)
	}
	return strings.Join(views, "; ")
}

// TestIntegration_Grow_DeployAllReachesTheNewNodes (issue 38): a module deployed to every
// node (`deploy --all`) on a single node is declared on both servers that join when it grows
// into a mesh of three, soon after they open — before, the one whose identity reached the
// controller after its first declarations waited for the next periodic check, a minute.
func TestIntegration_Grow_DeployAllReachesTheNewNodes(t *testing.T) {
	cfgA := clusterConfig(t, "a")
	cfgA.ClientTLS = "always" // the new nodes enrol through it with the CA their token carries
	if _, _, err := datadir.Prepare(cfgA, 1); err != nil {
		t.Fatal(err)
	}
	a := runRestarting(t, cfgA, "")
	a.awaitOpen(t, 30*time.Second)
	ca := filepath.Join(cfgA.DataDir, meshca.CAFile)
	opSeed := filepath.Join(cfgA.DataDir, datadir.OperatorSeedFile)
	op := connect(t, a.node().ClientURL(), opSeed, nats.CustomInboxPrefix(manifest.OperatorInbox), sdk.TrustCA(ca))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := admin.Register(ctx, op, []byte("module: ticker\nrequires: [mesh-bus]\n")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ticker")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(sleeper, "1")), 0o755); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(op)
	obs, err := artifact.Lookup(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := artifact.Put(ctx, obs, "ticker", "1", path); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Deploy(ctx, op, api.DeployRequest{Module: "ticker", Deployment: api.Deployment{Version: "1", All: true, Instances: 1}}); err != nil {
		t.Fatalf("deploy --all: %v", err)
	}

	body, _ := json.Marshal(api.GrowRequest{Expect: 3})
	msg, err := op.RequestWithContext(ctx, manifest.NodeToolSubject("a", api.NodeToolGrow), body)
	if err != nil || !strings.Contains(string(msg.Data), `"ok":true`) {
		t.Fatalf("grow: %v %s", err, msgData(msg))
	}
	var tok api.Token
	if _, err := vault.Call(ctx, op, api.VaultVerbToken, api.VaultCallerOperator, api.VaultRequest{TTL: "1h", Uses: 2}, &tok); err != nil {
		t.Fatal(err)
	}
	op.Close()
	var joined []*restartingNode
	for _, name := range []string{"b", "c"} {
		cfg := clusterConfig(t, name)
		cfg.ClientTLS = "always"
		if _, err := node.Join(ctx, cfg, tok.Token); err != nil {
			t.Fatalf("join %s: %v", name, err)
		}
		joined = append(joined, runRestarting(t, cfg, ""))
	}
	a.awaitOpen(t, 2*time.Minute)
	for _, j := range joined {
		j.awaitOpen(t, 2*time.Minute)
	}
	opened := time.Now()
	op = connect(t, a.node().ClientURL(), opSeed, nats.CustomInboxPrefix(manifest.OperatorInbox), sdk.TrustCA(ca))
	defer op.Close()
	js, _ = jetstream.New(op)
	// Well inside the controller's minute between two checks of every node.
	retryUntil(t, 20*time.Second, func() error {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		defer rcancel()
		st, err := js.Stream(rctx, manifest.StateStreamName)
		if err != nil {
			return err
		}
		for _, n := range []string{"a", "b", "c"} {
			m, err := st.GetLastMsgForSubject(rctx, manifest.StateSubject(n))
			if err != nil {
				return fmt.Errorf("%s's declaration: %w", n, err)
			}
			var d deploy.Declaration
			if err := json.Unmarshal(m.Data, &d); err != nil {
				return err
			}
			if mod, ok := d.Module("ticker"); !ok || mod.Version != "1" {
				return fmt.Errorf("%s is declared %+v, want ticker 1", n, d.Modules)
			}
		}
		return nil
	})
	t.Logf("every node declared ticker %s after the three opened", time.Since(opened).Round(time.Millisecond))
}
