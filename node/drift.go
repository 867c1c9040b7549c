package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/seats"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

// A mesh's streams and buckets are its memory: a deleted registry is not an empty mesh, and a
// node that quietly recreated it would start "ready" with no modules. So the node watches
// for drift — JetStream's deletion advisories, and a periodic check — and:
//   - recreates what loses nothing by being recreated: the streams (EVENTS, STATE, DEAD, a
//     seat's queue), the leases bucket, and every derived consumer; each repair is a node
//     event;
//   - never recreates the registry's or the vault's bucket: their loss is an alarm, and
//     /readyz says 503 with the reason until an operator restores them.
// An alarm is also raised when a bucket that this node has known is missing at start.

// driftRepairTimeout bounds one check with its repairs: remaking a mesh's streams on a busy,
// replicated mesh takes longer than an interval.
// driftSettle is how long a check waits after a deletion advisory: nats-server finishes
// removing a deleted stream's files after it announced the deletion, and a stream made again
// under the same name before then can lose its new files to that removal (its writes then
// fail with "error opening msg block file", seen in the leases' drift bed).
const (
	driftRepairTimeout = 45 * time.Second
	driftSettle        = 500 * time.Millisecond
)

// keptBuckets are the buckets whose loss only an operator can repair.
var keptBuckets = []string{registry.Bucket, vault.Bucket}

// bucketsKnown is the store key that says this node has opened its mesh's buckets before:
// from then on a missing registry or vault bucket is a loss, not a new mesh.
const bucketsKnown = "buckets-known"

func markBucketsKnown(db *bolt.DB) error { return datadir.MarkNow(db, bucketsKnown) }

func knowsBuckets(db *bolt.DB) bool { return datadir.Value(db, bucketsKnown) != "" }

// MarkerKey is the record every kept bucket holds from the day its mesh made it: the mesh's
// id. A node that has known the buckets and finds the bucket, or its marker, gone knows the
// bucket was lost — even after a restart recreated it empty.
const MarkerKey = "meta.mesh"

// checkKept raises an alarm for each kept bucket that is missing or lost its marker (once
// this node has known the buckets), clears it when the marker is back, and marks a bucket
// when mayMark says this node made it (nil: never). A node that joins a formed mesh does not
// mark: finding no marker there, it cannot tell a lost bucket from an old one, and marking
// would clear the other nodes' alarm. A bucket this node does not open (the vault's, on a
// server without the vault's credentials) and that does not exist is not its concern.
func (n *Node) checkKept(ctx context.Context, known bool, mayMark func(bucket string) bool) error {
	js := n.bus.JetStream()
	for _, bucket := range keptBuckets {
		kv, err := js.KeyValue(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			if known && (bucket != vault.Bucket || n.HasVault()) {
				n.alarms.Set("bucket."+bucket, lostBucketReason(bucket, "the bucket is gone"))
				n.log.Error("a mesh bucket is missing", "bucket", bucket)
			}
			continue
		}
		if err != nil {
			return err
		}
		_, err = kv.Get(ctx, MarkerKey)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			err = markerAtLeader(n.bus.Conn(), bucket)
		}
		switch {
		case err == nil:
			n.alarms.Clear("bucket." + bucket)
			if err := markerSeen(n.db, bucket); err != nil {
				return err
			}
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return err
		case known && sawMarker(n.db, bucket):
			// Gone only if this node saw it: a node that joined a forming mesh knows the
			// bucket before the genesis node has marked it.
			n.alarms.Set("bucket."+bucket, lostBucketReason(bucket, "its mesh marker is gone: it was deleted and made again empty"))
			n.log.Error("a mesh bucket lost its records", "bucket", bucket)
		case mayMark != nil && mayMark(bucket):
			w, err := n.markerWriter(ctx, bucket)
			if errors.Is(err, errNoVaultConn) {
				continue // not this node's to mark
			}
			if err != nil {
				return fmt.Errorf("mark %s: %w", bucket, err)
			}
			if _, err := w.Create(ctx, MarkerKey, []byte(n.id.MeshID)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
				return fmt.Errorf("mark %s: %w", bucket, err)
			}
			if err := markerSeen(n.db, bucket); err != nil {
				return err
			}
		}
	}
	return nil
}

// errNoVaultConn: this node does not hold the vault's credentials, so it has no connection
// that may write the vault's bucket.
var errNoVaultConn = errors.New("this node does not hold the vault's credentials, and only the vault's own connection writes its bucket")

// markerWriter is a handle on bucket for writing its marker: the vault's bucket through the
// vault's own connection (the node's own may not write it), the registry's through the
// node's.
func (n *Node) markerWriter(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	if bucket != vault.Bucket {
		return n.bus.JetStream().KeyValue(ctx, bucket)
	}
	if n.vaultNC == nil {
		return nil, errNoVaultConn
	}
	js, err := jetstream.New(n.vaultNC)
	if err != nil {
		return nil, err
	}
	return js.KeyValue(ctx, bucket)
}

// markerSeenKey is the store key that says this node has seen bucket's marker.
func markerSeenKey(bucket string) string { return "marker-seen." + bucket }

// markerSeen records that this node has seen bucket's marker (once).
func markerSeen(db *bolt.DB, bucket string) error {
	if sawMarker(db, bucket) {
		return nil
	}
	return datadir.MarkNow(db, markerSeenKey(bucket))
}

// sawMarker reports whether this node has seen bucket's marker.
func sawMarker(db *bolt.DB, bucket string) bool {
	return datadir.Value(db, markerSeenKey(bucket)) != ""
}

// markerAtLeader asks the bucket's stream leader for the marker. A key-value get is a
// direct get, which any replica answers: a replica still catching up (a node that has just
// joined, a busy mesh forming) answers "not found" for a marker the bucket holds, and that
// must not raise the alarm of a lost bucket. (nats.go's jetstream package turns every get of
// a stream that allows direct gets into one; its older API asks the leader unless told.)
func markerAtLeader(nc *nats.Conn, bucket string) error {
	js, err := nc.JetStream()
	if err != nil {
		return err
	}
	_, err = js.GetLastMsg("KV_"+bucket, "$KV."+bucket+"."+MarkerKey)
	if errors.Is(err, nats.ErrMsgNotFound) {
		return jetstream.ErrKeyNotFound
	}
	return err
}

// lostBucketReason is the alarm of a kept bucket that is gone.
func lostBucketReason(bucket, how string) string {
	what := "every module's registration and identity"
	if bucket == vault.Bucket {
		what = "every secret, module credential and join token"
	}
	return fmt.Sprintf("bucket %s was lost (%s): it held %s; restore it from a backup of a node's jetstream directory, or re-register the modules and mint their secrets again and then run `meshnode node accept-loss %s` — the node does not recreate it empty on its own", bucket, how, what, bucket)
}

// watchDrift checks the mesh's streams, buckets and consumers every drift-interval and at
// every deletion advisory, until ctx ends.
func (n *Node) watchDrift(ctx context.Context) error {
	kick := make(chan struct{}, 1)
	poke := func(*nats.Msg) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	var subs []*nats.Subscription
	for _, subject := range []string{"$JS.EVENT.ADVISORY.STREAM.DELETED.>", "$JS.EVENT.ADVISORY.CONSUMER.DELETED.>"} {
		sub, err := n.bus.Conn().Subscribe(subject, poke)
		if err != nil {
			return fmt.Errorf("watch drift: %w", err)
		}
		subs = append(subs, sub)
	}
	defer func() {
		for _, s := range subs {
			s.Unsubscribe()
		}
	}()
	t := time.NewTicker(time.Duration(n.cfg.DriftInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-kick:
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(driftSettle):
			}
		}
		cctx, cancel := context.WithTimeout(ctx, driftRepairTimeout)
		n.checkDrift(cctx)
		cancel()
	}
}

// checkDrift raises or clears the lost-bucket alarms and repairs what loses nothing.
func (n *Node) checkDrift(ctx context.Context) {
	js := n.bus.JetStream()
	n.checkBadRecords()
	if err := n.checkKept(ctx, true, nil); err != nil {
		n.log.Debug("drift check: JetStream did not answer", "err", err)
		return
	}
	// What loses nothing by being recreated. Every node needs the leases' bucket (without it
	// nobody holds the controller's seat) and its own audit consumer; the mesh's streams and
	// the modules' consumers are the controller's holder's, so nodes do not race for them.
	// Two listings, not a lookup per stream and consumer: the check runs every interval on
	// every node, whatever the size of the catalogue.
	topo := n.ctrl.Topology()
	streams, err := topo.StreamNames(ctx)
	if err != nil {
		n.log.Debug("drift check: JetStream did not list its streams", "err", err)
		return
	}
	controller := n.holdsController()
	var eventsConsumers map[string]bool
	if streams[manifest.EventsStreamName] {
		list := topo.EventsConsumerNames
		if controller {
			list = topo.EventsConsumers // and their ack floors: where one deleted is remade
		}
		if eventsConsumers, err = list(ctx); err != nil {
			n.log.Debug("drift check: JetStream did not list EVENTS' consumers", "err", err)
			return
		}
	}
	var missing []string
	if !streams["KV_"+seats.Bucket] {
		missing = append(missing, "bucket "+seats.Bucket)
	}
	audit := manifest.AuditConsumer(n.id.Name)
	if !eventsConsumers[audit.Name] {
		missing = append(missing, "consumer "+audit.Name)
	}
	// Every node looks at the mesh's streams and raises the alarm; only the controller's
	// holder remakes them, so nodes do not race.
	for _, name := range []string{manifest.EventsStreamName, manifest.StateStreamName, manifest.DeadStreamName} {
		if !streams[name] {
			missing = append(missing, "stream "+name)
		}
	}
	for _, s := range manifest.Builtin().Seats {
		if s.Stream != nil && !streams[s.Stream.Name] && !slices.Contains(missing, "stream "+s.Stream.Name) {
			missing = append(missing, "stream "+s.Stream.Name)
		}
	}
	for _, e := range n.reg.List() {
		for _, s := range e.Derivation.Seats {
			if s.Stream != nil && !streams[s.Stream.Name] && !slices.Contains(missing, "stream "+s.Stream.Name) {
				missing = append(missing, "stream "+s.Stream.Name)
			}
		}
		if c := e.Derivation.EventsConsumer; c != nil && !eventsConsumers[c.Name] {
			missing = append(missing, "consumer "+c.Name)
		}
	}
	if len(missing) == 0 {
		n.alarms.Clear("drift") // whoever repaired it, nothing is missing now
		return
	}
	leasesLost := slices.Contains(missing, "bucket "+seats.Bucket)
	// Each step is retried on its own: a step that succeeded is not done again because a
	// later one timed out.
	steps := []func(context.Context) error{
		func(ctx context.Context) error {
			_, err := seats.EnsureBucket(ctx, js, n.replicas(), seats.DefaultTTL, n.budget.Leases)
			return err
		},
	}
	if leasesLost {
		steps = append(steps, n.seats.store.Rewatch)
	}
	if controller {
		steps = append(steps, n.ctrl.Topology().EnsureMesh,
			func(ctx context.Context) error { return n.ctrl.Topology().EnsureModule(ctx, manifest.Builtin()) })
		for _, e := range n.reg.List() {
			ensure := n.ctrl.Topology().EnsureModule
			if c := e.Derivation.EventsConsumer; c != nil && streams[manifest.EventsStreamName] && !eventsConsumers[c.Name] {
				ensure = n.ctrl.Topology().RepairModule
			}
			steps = append(steps, func(ctx context.Context) error { return ensure(ctx, e.Derivation) })
		}
	} else {
		steps = append(steps, n.ctrl.Topology().EnsureAudit)
	}
	for _, step := range steps {
		if err = jsretry.Request(ctx, step); err != nil {
			break
		}
	}
	if err != nil {
		n.alarms.Set("drift", fmt.Sprintf("the mesh's %s went missing and could not be recreated: %v", strings.Join(missing, ", "), err))
		n.log.Error("drift: repair failed", "missing", missing, "err", err)
		return
	}
	notOwn := func(what string) bool { return what != "bucket "+seats.Bucket && what != "consumer "+audit.Name }
	if !controller && slices.ContainsFunc(missing, notOwn) {
		// What is the controller's to remake stands as an alarm until the next check finds
		// it remade.
		n.alarms.Set("drift", fmt.Sprintf("the mesh's %s went missing; the holder of %s remakes it", strings.Join(missing, ", "), manifest.ControllerSeat))
		return
	}
	n.alarms.Clear("drift")
	n.log.Warn("drift: recreated what was missing", "recreated", missing)
	if nc := n.mesh.eventConn.Load(); nc != nil {
		publishNodeEvent(nc, n.key, n.id.Name, "drift", map[string]any{"recreated": missing}, n.log)
	}
}

// checkBadRecords raises an alarm (and a node event, once per change) while the registry or
// the vault mirrors records they refused: skipped, never trusted, but an operator must know.
func (n *Node) checkBadRecords() {
	report := func(key, what string, bad []string, fix string) {
		if len(bad) == 0 {
			if n.alarms.Clear(key) {
				n.log.Info("no more refused records", "in", what)
			}
			return
		}
		shown := bad
		if len(shown) > 5 {
			shown = append(slices.Clone(shown[:5]), fmt.Sprintf("and %d more", len(bad)-5))
		}
		reason := fmt.Sprintf("%s holds %d record(s) it refused and skips (%s): %s", what, len(bad), strings.Join(shown, ", "), fix)
		if n.alarms.Set(key, reason) {
			n.log.Error("refused records", "in", what, "keys", bad)
			if nc := n.mesh.eventConn.Load(); nc != nil {
				publishNodeEvent(nc, n.key, n.id.Name, "bad-records", map[string]any{"bucket": what, "keys": bad}, n.log)
			}
		}
	}
	report("bad.registry", registry.Bucket, n.reg.Bad(), "register those modules again (a write replaces a refused record), or delete the keys")
	if v := n.dir.vault.Load(); v != nil {
		report("bad.vault", vault.Bucket, v.Bad(), "mint those secrets again (a mint replaces a refused record)")
	}
}

// holdsController reports whether this node holds the mesh-controller seat now.
func (n *Node) holdsController() bool {
	s := n.seats
	if s == nil {
		return false
	}
	l, ok := s.store.Get(seats.Key(manifest.ControllerSeat, manifest.ScopeMesh, ""))
	return ok && l.Node == n.id.Name
}

// serveAcceptLoss answers api.NodeToolAcceptLoss.
func (n *Node) serveAcceptLoss() (*nats.Subscription, error) {
	return n.resp.nc.Subscribe(manifest.NodeToolSubject(n.id.Name, api.NodeToolAcceptLoss), func(m *nats.Msg) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		respondCluster(m, n.acceptLoss(ctx, m.Data))
	})
}

func (n *Node) acceptLoss(ctx context.Context, data []byte) error {
	var req api.AcceptLossRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return errors.New("the request is not JSON")
	}
	if !slices.Contains(keptBuckets, req.Bucket) {
		return fmt.Errorf("%q is not a bucket whose loss is accepted: name %s", req.Bucket, strings.Join(keptBuckets, " or "))
	}
	kv, err := n.markerWriter(ctx, req.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("bucket %s does not exist: restart a node (it makes the bucket again, empty), then accept its loss", req.Bucket)
	}
	if errors.Is(err, errNoVaultConn) {
		return fmt.Errorf("%w yet (a server asks the vault for them at start): ask another node of the mesh", err)
	}
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, MarkerKey, []byte(n.id.MeshID)); err != nil {
		return fmt.Errorf("mark %s: %w", req.Bucket, err)
	}
	n.alarms.Clear("bucket." + req.Bucket)
	if nc := n.mesh.eventConn.Load(); nc != nil {
		publishNodeEvent(nc, n.key, n.id.Name, "loss-accepted", map[string]any{"bucket": req.Bucket}, n.log)
	}
	n.log.Warn("the operator accepted a bucket's loss", "bucket", req.Bucket)
	return nil
}
