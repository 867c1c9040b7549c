package node

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/genesis"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/membership"
	"github.com/meshnode/meshnode/registry"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A single node's JetStream is standalone, and a standalone server restarted clustered
// loses its streams (nats-server#5467, DESIGN §6): growing one node into a mesh is a
// migration. `meshnode grow --expect N` puts the node in the waiting phase: it gossips, and
// the vault's join tokens carry the growth, so the joining nodes form the mesh with it and
// then wait for its state. Once N servers are alive the node restarts (Run returns
// ErrRestart) and, before anything connects, snapshots every stream (KV buckets and object
// stores are streams) to <data-dir>/grow, moves its standalone store aside, starts clustered
// with the others, restores each stream, checks its message count and sequences against
// the snapshot, and scales it to 3 replicas — the mesh's registry last, which is what the
// joining nodes wait for. Each phase is recorded in the foundation before the next begins:
// a node interrupted while snapshotting starts over from its untouched store; one
// interrupted while restoring resumes, keeping the streams already restored whole. Until
// every stream is restored the node's clients find its port closed (the bus listens on a
// free loopback port), and then it starts its bus again on the node's port.

// The phases of growing (genesis.Foundation.GrowPhase).
const (
	growWaiting   = "waiting"   // gossiping, standalone, until the other servers are alive
	growSnapshot  = "snapshot"  // at the next start: snapshot every stream, move the store aside
	growRestoring = "restoring" // clustered: restore and scale every stream
)

// restoreTimeout bounds one attempt at restoring a stream, and restoreAttempts how many
// are made, from restorePause apart doubling to 10 times that (a minute in all), before the
// start fails (and the next start goes on).
const (
	restoreTimeout  = 2 * time.Minute
	restoreAttempts = 10
	restorePause    = time.Second
)

// apiWait bounds each JetStream request of a restore but the snapshot's upload and the
// waits for replicas (see restoreStream). A variable for a test.
var apiWait = 10 * time.Second

// growDir holds the snapshots and the standalone store while the node grows.
const growDir = "grow"

// ErrRestart means Run ended so that the node is opened again: it grows (see grow.go).
var ErrRestart = errors.New("the node restarts to go on growing")

// growManifest is what growDir's snapshots are: each stream's configuration and state.
type growManifest struct {
	Streams []grownStream `json:"streams"`
}

type grownStream struct {
	Config server.StreamConfig `json:"config"`
	State  server.StreamState  `json:"state"`
	// Consumers are the stream's durable consumers, whose state the snapshot holds.
	Consumers []string `json:"consumers,omitempty"`
}

// serveGrow answers the single node's grow tool.
func (n *Node) serveGrow() (*nats.Subscription, error) {
	return n.respNC.Subscribe(manifest.NodeToolSubject(n.id.Name, api.NodeToolGrow), func(m *nats.Msg) {
		var req api.GrowRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			respondCluster(m, errors.New("the request is not JSON"))
			return
		}
		respondCluster(m, n.beginGrow(req.Expect))
	})
}

// beginGrow puts the single node in the waiting phase of growing into a mesh of expect
// servers, and starts its gossip.
func (n *Node) beginGrow(expect int) error {
	if err := n.keepGrowth(expect); err != nil {
		return err
	}
	n.log.Info("growing into a mesh: waiting for the other servers to join", "expect", expect, "gossip_addr", n.cfg.GossipAddr, "cluster_addr", n.cfg.ClusterAddr)
	return n.gossipToGrow()
}

// keepGrowth records the waiting phase of growing into expect servers.
func (n *Node) keepGrowth(expect int) error {
	n.growMu.Lock()
	defer n.growMu.Unlock()
	switch {
	case n.found.Expect >= 3:
		return fmt.Errorf("mesh %s already has %d servers: add one with `meshnode token create` and `meshnode join`", n.id.MeshID, n.found.Expect)
	case expect < 3:
		return fmt.Errorf("--expect %d: a mesh has 3 or more servers (two cannot lose one, and one is what this node is)", expect)
	case n.found.GrowTo > 0 && n.found.GrowTo != expect:
		return fmt.Errorf("this node already grows into %d servers; run `meshnode grow --expect %d` for its token again", n.found.GrowTo, n.found.GrowTo)
	case n.found.GrowTo > 0:
		return nil // asked again: the same growth, a new token
	}
	if _, err := advertised(n.cfg, nil); err != nil {
		return err
	}
	f := *n.found
	f.GrowTo, f.GrowPhase = expect, growWaiting
	if err := genesis.New(n.db).Keep(&f); err != nil {
		return fmt.Errorf("keep the growth: %w", err)
	}
	n.found.GrowTo, n.found.GrowPhase = expect, growWaiting
	return nil
}

// gossipToGrow starts the waiting node's gossip: the joining nodes find it with the
// enrolment's seeds; once all are alive the node restarts to migrate.
func (n *Node) gossipToGrow() error {
	// Once: a grow request may come while the start begins it (announce), or again.
	n.growMu.Lock()
	started := n.growStarted
	n.growStarted = true
	n.growMu.Unlock()
	if started {
		return nil
	}
	adv, err := advertised(n.cfg, nil)
	if err != nil {
		return err
	}
	if n.cfg.Advertise == "" {
		adv.gossip = ""
	}
	kick := make(chan struct{}, 1)
	m, err := membership.Open(membership.Config{
		Meta:          membership.Meta{Name: n.id.Name, MeshID: n.id.MeshID, Route: "nats-route://" + adv.route, Client: "nats://" + adv.client},
		BindAddr:      n.cfg.GossipAddr,
		AdvertiseAddr: adv.gossip,
		GossipKey:     n.found.GossipKey,
		Log:           n.log,
		// Called under memberlist's lock, which Members takes: the count is made elsewhere.
		OnChange: func(membership.Member) {
			select {
			case kick <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		n.growMu.Lock()
		n.growStarted = false
		n.growMu.Unlock()
		return fmt.Errorf("gossip: %w; set --gossip-addr", err)
	}
	n.growMu.Lock()
	n.growGossip = m
	n.growStop = make(chan struct{})
	stop := n.growStop
	n.growMu.Unlock()
	n.setGrowing(fmt.Sprintf("growing into %d servers: waiting for %d more to join", n.found.GrowTo, n.found.GrowTo-1))
	n.growWG.Add(1)
	go func() {
		defer n.growWG.Done()
		for {
			n.growMembersChanged()
			select {
			case <-kick:
			case <-stop:
				return
			}
		}
	}()
	return nil
}

// growTo is the servers the single node grows into, 0 when it is not growing.
func (n *Node) growTo() int {
	n.growMu.Lock()
	defer n.growMu.Unlock()
	return n.found.GrowTo
}

// growMembers is the waiting node's gossip, nil when it is not waiting to grow.
func (n *Node) growMembers() *membership.Membership {
	n.growMu.Lock()
	defer n.growMu.Unlock()
	return n.growGossip
}

// growMembersChanged restarts the waiting node once every server of the mesh it grows into
// is alive, remembering their gossip addresses to find them again.
func (n *Node) growMembersChanged() {
	n.growMu.Lock()
	defer n.growMu.Unlock()
	if n.growGossip == nil || n.found.GrowPhase != growWaiting {
		return
	}
	var alive []membership.Member
	for _, x := range n.growGossip.Members() {
		if x.State == "alive" {
			alive = append(alive, x)
		}
	}
	if len(alive) < n.found.GrowTo {
		n.setGrowing(fmt.Sprintf("growing into %d servers: waiting for %d more to join: have %s", n.found.GrowTo, n.found.GrowTo-len(alive), strings.Join(names(alive), ", ")))
		return
	}
	f := *n.found
	f.GrowPhase = growSnapshot
	if f.GrowTo == 0 || n.restart.Load() {
		return
	}
	for _, x := range alive {
		if x.Name != n.id.Name && !slices.Contains(f.Seeds, x.Addr) {
			f.Seeds = append(f.Seeds, x.Addr)
		}
	}
	if err := genesis.New(n.db).Keep(&f); err != nil {
		n.log.Error("keep the growth's next phase; still waiting", "err", err)
		return
	}
	// The next start reads the phase from the store: n.found stays as it is.
	n.log.Info("every server of the mesh is here: restarting to move this node's streams into the mesh", "members", names(alive))
	n.restart.Store(true)
	n.requestStop()
}

// setGrowing is the growth's progress, for status and /readyz.
func (n *Node) setGrowing(progress string) {
	n.growing.Store(&progress)
}

// Growing is the node's growth into a mesh, "" when it is not growing.
func (n *Node) Growing() string {
	if p := n.growing.Load(); p != nil {
		return *p
	}
	return ""
}

// grow runs the migration phases at start (see the top of this file) and leaves the node's
// bus started, clustered, with every stream restored.
func (n *Node) grow(octx context.Context) error {
	dir := filepath.Join(n.cfg.DataDir, growDir)
	store, aside := filepath.Join(n.cfg.DataDir, jsDir), filepath.Join(dir, jsDir)
	if n.found.GrowPhase == growSnapshot {
		// Start over from the standalone store: put it back if a move was not recorded.
		if _, err := os.Stat(aside); err == nil {
			if err := os.RemoveAll(store); err != nil {
				return err
			}
			if err := os.Rename(aside, store); err != nil {
				return err
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		n.setPhase("growing: taking a snapshot of every stream")
		// On a free loopback port: nothing but this node connects while it snapshots.
		if err := n.startBus(octx, nil, "127.0.0.1:0"); err != nil {
			return err
		}
		err := snapshotAll(octx, n.bus.Conn(), dir, n.log.Info)
		n.bus.Close()
		n.bus = nil
		if err != nil {
			return fmt.Errorf("grow: snapshot: %w; the store is untouched, and the next start tries again", err)
		}
		if err := os.Rename(store, aside); err != nil {
			return err
		}
		f := *n.found
		f.GrowPhase, f.Expect, f.Formed = growRestoring, f.GrowTo, false
		if err := genesis.New(n.db).Keep(&f); err != nil {
			return err
		}
		*n.found = f
	}
	n.setPhase("growing: forming the mesh with the other servers")
	cluster, err := n.form(octx)
	if err != nil {
		return err
	}
	// Clients on a free loopback port while the streams are restored (minutes, for a large
	// store): the node cannot tell modules apart before it reads the restored registry, and
	// on its own port it would hold each connect and then refuse it; a closed port is what
	// every client waits out. The bus starts again on the node's port once restored. Its
	// peers must not hand that port to their clients.
	restoring := *cluster
	restoring.NoAdvertise = true
	if err := n.startBus(octx, &restoring, "127.0.0.1:0"); err != nil {
		return err
	}
	// Every server a JetStream peer first: a stream is placed, and scaled, only on peers
	// the meta group knows.
	n.setPhase("growing: waiting for every server to be a JetStream peer")
	for {
		current := 0
		for _, ok := range n.bus.Peers() {
			if ok {
				current++
			}
		}
		if current >= n.found.Expect && n.bus.MetaLeader() != "" {
			break
		}
		select {
		case <-octx.Done():
			return fmt.Errorf("grow: waiting for %d JetStream peers: %w", n.found.Expect, octx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	var man growManifest
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err == nil {
		err = json.Unmarshal(b, &man)
	}
	if err != nil {
		return fmt.Errorf("grow: the snapshots' manifest: %w; the standalone store is in %s", err, aside)
	}
	for _, s := range man.Streams {
		n.setPhase("growing: restoring " + s.Config.Name)
		lost, err := restoreRetrying(octx, n.log, n.bus.Conn(), n.bus.JetStream(), dir, s, n.replicas())
		if err != nil {
			return fmt.Errorf("grow: restore %s: %w; the next start goes on (the standalone store is in %s)", s.Config.Name, err, aside)
		}
		if len(lost) > 0 {
			n.log.Warn("restored without consumers the mesh never registered; the mesh's own are made again, their deliveries from the start",
				"stream", s.Config.Name, "consumers", lost, "waited", registerWait)
		}
		n.log.Info("restored into the mesh", "stream", s.Config.Name, "messages", s.State.Msgs, "last_seq", s.State.LastSeq, "replicas", n.replicas())
	}
	f := *n.found
	f.GrowTo, f.GrowPhase = 0, ""
	if err := genesis.New(n.db).Keep(&f); err != nil {
		return err
	}
	*n.found = f
	if err := os.RemoveAll(dir); err != nil {
		n.log.Warn("remove the snapshots and the standalone store", "dir", dir, "err", err)
	}
	n.log.Info("grown into a mesh", "mesh_id", n.id.MeshID, "members", n.found.Members, "streams", len(man.Streams))
	n.setPhase("grown into a mesh: starting the bus on the node's client port")
	n.bus.Close()
	n.bus = nil
	return n.startBus(octx, cluster, n.cfg.ClientAddr)
}

// snapshotAll writes a snapshot of every stream of the account into dir, and the manifest,
// the registry's bucket last (see restoreStream).
func snapshotAll(ctx context.Context, nc *nats.Conn, dir string, logf func(string, ...any)) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var names []string
	for name := range js.StreamNames(ctx).Name() {
		names = append(names, name)
	}
	registryStream := "KV_" + registry.Bucket
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case a == registryStream:
			return 1
		case b == registryStream:
			return -1
		}
		return strings.Compare(a, b)
	})
	var man growManifest
	for _, name := range names {
		s, err := snapshotStream(ctx, nc, dir, name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		logf("snapshot taken", "stream", name, "messages", s.State.Msgs, "last_seq", s.State.LastSeq)
		man.Streams = append(man.Streams, s)
	}
	b, err := json.Marshal(man)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "manifest.json"), b, 0o600)
}

// snapshotStream writes the snapshot of stream name to dir/<name>.snap
// ($JS.API.STREAM.SNAPSHOT: chunks to an inbox, each acknowledged, an empty message last).
func snapshotStream(ctx context.Context, nc *nats.Conn, dir, name string) (grownStream, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return grownStream{}, err
	}
	defer sub.Unsubscribe()
	req, _ := json.Marshal(server.JSApiStreamSnapshotRequest{DeliverSubject: inbox, ChunkSize: 128 << 10})
	msg, err := nc.RequestWithContext(ctx, fmt.Sprintf(server.JSApiStreamSnapshotT, name), req)
	if err != nil {
		return grownStream{}, err
	}
	var resp server.JSApiStreamSnapshotResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return grownStream{}, err
	}
	if resp.Error != nil {
		return grownStream{}, resp.Error
	}
	f, err := os.OpenFile(filepath.Join(dir, name+".snap"), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return grownStream{}, err
	}
	defer f.Close()
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return grownStream{}, fmt.Errorf("snapshot chunk: %w", err)
		}
		if len(m.Data) == 0 {
			if status := m.Header.Get("Status"); status != "" && status != "204" {
				return grownStream{}, fmt.Errorf("snapshot ended with %s %s", status, m.Header.Get("Description"))
			}
			break
		}
		if _, err := f.Write(m.Data); err != nil {
			return grownStream{}, err
		}
		if m.Reply != "" {
			m.Respond(nil) // flow control: the next chunk
		}
	}
	if err := f.Sync(); err != nil {
		return grownStream{}, err
	}
	// Its durable consumers, which the restore must bring back: on the standalone server
	// nothing else changes them while it snapshots.
	g := grownStream{Config: *resp.Config, State: *resp.State}
	js, err := jetstream.New(nc)
	if err != nil {
		return grownStream{}, err
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return grownStream{}, err
	}
	consumers := st.ListConsumers(ctx)
	for ci := range consumers.Info() {
		// One that may go when idle (its own inactivity threshold, or the stream's) may
		// rightly be gone by the time the mesh registers it.
		if ci.Config.Durable != "" && ci.Config.InactiveThreshold == 0 && resp.Config.ConsumerLimits.InactiveThreshold == 0 {
			g.Consumers = append(g.Consumers, ci.Name)
		}
	}
	if err := consumers.Err(); err != nil {
		return grownStream{}, fmt.Errorf("list the consumers of %s: %w", name, err)
	}
	slices.Sort(g.Consumers)
	return g, nil
}

// restoreRetrying restores s as restoreStream does, again after a growing pause when an
// attempt fails, up to restoreAttempts times. Not retryJS's short attempts: a restore is
// several requests, and one cut short may still complete — the next attempt finds the
// stream and checks it. Nor is a failure always the mesh's: nats-server removes a deleted
// stream's files, and an emptied streams directory, in the background, and a restore of the
// same name at once failed now and then in 2.15.2 ("could not create storage directory",
// "expected sequence does not match store"); the next attempt went through.
func restoreRetrying(ctx context.Context, log *slog.Logger, nc *nats.Conn, js jetstream.JetStream, dir string, s grownStream, replicas int) (lost []string, err error) {
	pause := backoff.Backoff{First: restorePause, Max: 10 * restorePause}
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, restoreTimeout)
		lost, err = restoreStream(actx, nc, js, dir, s, replicas)
		cancel()
		if err == nil || ctx.Err() != nil || attempt == restoreAttempts {
			return lost, err
		}
		log.Info("restore again", "stream", s.Config.Name, "attempt", attempt, "err", err)
		if pause.Wait(ctx) != nil {
			return nil, err
		}
	}
}

// restoreStream restores s from dir into the clustered JetStream with replicas, unless it is
// there already, whole: a stream half restored by an interrupted start is deleted and
// restored again. It checks the count and the sequences against the snapshot's, and waits
// for the stream and the snapshot's durable consumers to be caught up on their replicas.
func restoreStream(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, dir string, s grownStream, replicas int) (lost []string, err error) {
	name := s.Config.Name
	// A stream whose messages age (max age, per-message TTLs: EVENTS, DEAD, the leases) may
	// have lost its oldest between the snapshot and the restore, never its newest.
	ages := s.Config.MaxAge > 0 || s.Config.AllowMsgTTL
	same := func(st jetstream.StreamState) bool {
		if ages {
			return st.LastSeq == s.State.LastSeq && st.Msgs <= s.State.Msgs && (st.Msgs == 0 || st.FirstSeq >= s.State.FirstSeq)
		}
		return st.Msgs == s.State.Msgs && st.LastSeq == s.State.LastSeq && (st.Msgs == 0 || st.FirstSeq == s.State.FirstSeq)
	}
	// Each request but the upload and the waits is bounded by apiWait: nats.go waits for an
	// answer as long as ctx allows, and a server just restarted into the mesh leaves one
	// unanswered now and then where the next is answered at once.
	brief := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, apiWait) }
	stream := func() (jetstream.Stream, error) {
		bctx, cancel := brief()
		defer cancel()
		st, err := js.Stream(bctx, name)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("stream info: %w", err)
		}
		return st, err
	}
	remove := func() error {
		bctx, cancel := brief()
		defer cancel()
		if err := js.DeleteStream(bctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("delete: %w", err)
		}
		return nil
	}
	update := func(cfg jetstream.StreamConfig) error {
		bctx, cancel := brief()
		defer cancel()
		_, err := js.UpdateStream(bctx, cfg)
		return err
	}
	st, err := stream()
	if err == nil {
		info := st.CachedInfo()
		if info.Config.Replicas == replicas && info.Config.Metadata[restoringMeta] == "" {
			// Restored and checked by an earlier start: the mesh may have written to it
			// (and removed consumers) since — the joining nodes go on once the registry
			// is — so it is kept as it is, never compared and restored again.
			return awaitReplicas(ctx, js, name, replicas, nil)
		}
		// Marked, or restored alone by an earlier version: its messages and its consumers
		// (a restarting server drops restored consumers the mesh had not registered yet)
		// are the snapshot's, or it is restored again.
		bctx, cancel := brief()
		missing, lerr := missingConsumers(bctx, st, s.Consumers)
		cancel()
		// Its leader answers, and the meta leader, which lists consumers, holds it with an
		// error or not at all (nats-server says "stream not found" for both): restored again.
		broken := errors.Is(lerr, jetstream.ErrStreamNotFound)
		if lerr != nil && !broken {
			return nil, fmt.Errorf("list consumers: %w", lerr)
		}
		if broken || !same(info.State) || len(missing) > 0 {
			if err := remove(); err != nil {
				return nil, err
			}
			// Gone now, or this attempt ends: a stream still answering after its delete
			// (a member yet to apply it) is not one to check against the snapshot.
			if _, err = stream(); err == nil {
				return nil, errors.New("still answers after its delete")
			}
		}
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Restored at its replicas: the restoring server takes the snapshot and the others
		// catch up through the stream's group. Restored alone and scaled after, a work
		// queue's stream (a seat's) waits 10 s for its consumers to scale with it, which
		// they do only once it has (nats-server 2.15's waitOnConsumerAssignments).
		// Marked until it is checked and caught up.
		s.Config.Replicas = replicas
		s.Config.Metadata = maps.Clone(s.Config.Metadata)
		if s.Config.Metadata == nil {
			s.Config.Metadata = map[string]string{}
		}
		s.Config.Metadata[restoringMeta] = "true"
		if err := restoreSnapshot(ctx, nc, dir, s); err != nil {
			var apiErr *server.ApiError
			if errors.As(err, &apiErr) && apiErr.ErrCode == uint16(server.JSStreamNameExistRestoreFailedErr) {
				// A restore cut short holds the name without a stream: deleting the name
				// clears it for the next attempt.
				remove()
			}
			return nil, fmt.Errorf("restore: %w", err)
		}
		if restoredHook != nil {
			if err := restoredHook(name); err != nil {
				return nil, err
			}
		}
		if st, err = stream(); err != nil {
			err = fmt.Errorf("after the restore: %w", err)
		}
	}
	if err != nil {
		return nil, err
	}
	if got := st.CachedInfo().State; !same(got) {
		return nil, fmt.Errorf("restored %d messages, sequences %d–%d; the snapshot had %d, %d–%d", got.Msgs, got.FirstSeq, got.LastSeq, s.State.Msgs, s.State.FirstSeq, s.State.LastSeq)
	}
	cfg := st.CachedInfo().Config
	if cfg.Replicas != replicas {
		// Restored alone by an earlier version of this code: scaled now.
		cfg.Replicas = replicas
		if err := update(cfg); err != nil {
			return nil, fmt.Errorf("scale to %d replicas: %w", replicas, err)
		}
	}
	if lost, err = awaitReplicas(ctx, js, name, replicas, s.Consumers); err != nil {
		return nil, err
	}
	if _, marked := cfg.Metadata[restoringMeta]; marked {
		delete(cfg.Metadata, restoringMeta)
		if err := update(cfg); err != nil {
			return nil, fmt.Errorf("mark %s restored: %w", name, err)
		}
	}
	return lost, nil
}

// restoredHook, when set (by a test), is called as a stream's restore has been answered,
// before it is checked: an error returned ends the attempt there.
var restoredHook func(stream string) error

// restoringMeta marks a stream's configuration from its restore until its messages are
// checked against the snapshot's and it and its consumers are caught up: an interrupted
// growth's next start compares a marked stream again, and the joining nodes wait for the
// registry's mark to go.
const restoringMeta = "meshnode.restoring"

// consumerInfo is the info of st's consumer name, pull or push (a KV watcher's).
func consumerInfo(ctx context.Context, st jetstream.Stream, name string) (*jetstream.ConsumerInfo, error) {
	c, err := st.Consumer(ctx, name)
	if errors.Is(err, jetstream.ErrNotPullConsumer) {
		pc, err := st.PushConsumer(ctx, name)
		if err != nil {
			return nil, err
		}
		return pc.CachedInfo(), nil
	}
	if err != nil {
		return nil, err
	}
	return c.CachedInfo(), nil
}

// missingConsumers returns which of names st does not have (yet).
func missingConsumers(ctx context.Context, st jetstream.Stream, names []string) ([]string, error) {
	have := map[string]bool{}
	lister := st.ConsumerNames(ctx)
	for c := range lister.Name() {
		have[c] = true
	}
	if err := lister.Err(); err != nil {
		return nil, err
	}
	return notIn(names, have), nil
}

// notIn returns which of names have does not hold.
func notIn(names []string, have map[string]bool) []string {
	return slices.DeleteFunc(slices.Clone(names), func(c string) bool { return have[c] })
}

// awaitReplicas waits until stream name, each of its durable consumers and each of want
// have a leader and their other replicas caught up: before that the new servers cannot
// stand in for the one that restored them, and a consumer on it alone (a seat's queue)
// would go with it. The mesh registers a restored consumer a moment after the restore's
// answer (nats-server retries every 5 s), so want names those the snapshot had. A peer
// counts as caught up when its log is current, which is as far as nats-server reports.
//
// A wanted consumer still not registered registerWait after the stream is whole is given up
// (returned as lost): it may have gone for good (an inactivity threshold, a client), and
// restoring the stream again for it would go round for ever.
func awaitReplicas(ctx context.Context, js jetstream.JetStream, name string, replicas int, want []string) (lost []string, err error) {
	whole := func(c *jetstream.ClusterInfo, replicas int) bool {
		if c == nil {
			return replicas <= 1 // a server of its own (not clustered) says nothing
		}
		return c.Leader != "" && len(c.Replicas) == replicas-1 &&
			!slices.ContainsFunc(c.Replicas, func(p *jetstream.PeerInfo) bool { return !p.Current })
	}
	behind := name
	var wholeSince time.Time // when the stream was first seen whole
	for {
		bctx, cancel := context.WithTimeout(ctx, apiWait)
		st, err := js.Stream(bctx, name)
		cancel()
		if err == nil && whole(st.CachedInfo().Cluster, replicas) {
			if wholeSince.IsZero() {
				wholeSince = time.Now()
			}
			behind = ""
			// Each consumer's own info, asked briefly: a consumer list waits 4 s for any
			// consumer that has no leader yet, where one is elected within a second.
			listed := map[string]bool{}
			lctx, cancel := context.WithTimeout(ctx, apiWait)
			names := st.ConsumerNames(lctx)
			for c := range names.Name() {
				listed[c] = true
			}
			if names.Err() != nil {
				behind = name + "'s consumers"
			}
			cancel()
			for c := range listed {
				if behind != "" {
					break
				}
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				info, err := consumerInfo(cctx, st, c)
				cancel()
				if errors.Is(err, jetstream.ErrConsumerNotFound) {
					continue // gone since the list
				}
				if err != nil {
					behind = name + "'s consumer " + c
					continue
				}
				// An ephemeral (a watcher's) stays on one server; a durable has the
				// stream's replicas unless it set its own.
				if info.Config.Durable != "" && !whole(info.Cluster, cmp.Or(info.Config.Replicas, replicas)) {
					behind = name + "'s consumer " + c
				}
			}
			missing := notIn(want, listed)
			if behind == "" && len(missing) > 0 && time.Since(wholeSince) < registerWait {
				behind = name + "'s consumer " + missing[0] + " (not registered yet)"
			}
			if behind == "" {
				return missing, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s has not caught up on %d replicas: %w", behind, replicas, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// registerWait is how long awaitReplicas waits for a restored consumer to be registered
// once its stream is whole: nats-server asks for it every 5 s. A variable for a test.
var registerWait = 20 * time.Second

// restoreSnapshot sends dir/<name>.snap to $JS.API.STREAM.RESTORE: the chunks, each a
// request, then an empty message, answered with the stream's creation.
func restoreSnapshot(ctx context.Context, nc *nats.Conn, dir string, s grownStream) error {
	name := s.Config.Name
	req, _ := json.Marshal(server.JSApiStreamRestoreRequest{Config: s.Config, State: s.State})
	// Answered once the meta group has placed the stream and its restoring server listens:
	// longer than apiWait, short of the attempt.
	rctx, cancel := context.WithTimeout(ctx, 3*apiWait)
	msg, err := nc.RequestWithContext(rctx, fmt.Sprintf(server.JSApiStreamRestoreT, name), req)
	cancel()
	if err != nil {
		return fmt.Errorf("restore request: %w", err)
	}
	var resp server.JSApiStreamRestoreResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	f, err := os.Open(filepath.Join(dir, name+".snap"))
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := make([]byte, 128<<10)
	for {
		k, err := f.Read(chunk)
		if k > 0 {
			if err := sendChunk(ctx, nc, resp.DeliverSubject, chunk[:k]); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the snapshot of %s: %w", name, err)
		}
	}
	ectx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	msg, err = nc.RequestWithContext(ectx, resp.DeliverSubject, nil)
	if err != nil {
		return fmt.Errorf("restore end: %w", err)
	}
	var done server.JSApiStreamCreateResponse
	if err := json.Unmarshal(msg.Data, &done); err != nil {
		return err
	}
	if done.Error != nil {
		return done.Error
	}
	return nil
}

// sendChunk sends one chunk of a restore, again while nobody answers yet: the restoring
// server's interest in the subject crosses the route a moment after its answer.
func sendChunk(ctx context.Context, nc *nats.Conn, subject string, chunk []byte) error {
	for {
		_, err := nc.RequestWithContext(ctx, subject, chunk)
		if !errors.Is(err, nats.ErrNoResponders) {
			if err != nil {
				return fmt.Errorf("restore chunk: %w", err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restore chunk: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// awaitGrowth holds a node that joined a growing single node until that node has restored
// the mesh's state: the registry's bucket, restored last, at the mesh's replicas.
func (n *Node) awaitGrowth(ctx context.Context) error {
	n.setPhase("waiting for the growing node to move the mesh's streams into the mesh")
	js := n.bus.JetStream()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := js.Stream(rctx, "KV_"+registry.Bucket)
		cancel()
		if err == nil && st.CachedInfo().Config.Replicas >= n.replicas() && st.CachedInfo().Config.Metadata[restoringMeta] == "" {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the growing node to bring the mesh's streams: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	f := *n.found
	f.AwaitGrowth = false
	if err := genesis.New(n.db).Keep(&f); err != nil {
		return err
	}
	*n.found = f
	return nil
}
