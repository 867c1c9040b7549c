// Package host is a node's side of deployment as state (DESIGN §12): it follows the node's
// own declaration on STATE, takes only one that is newer than the last it applied and signed
// by the mesh's controller, keeps that one in the node's bbolt so a restart resumes from it
// before the bus is back, and hands it to the supervisor that runs the modules.
package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

// bucket is the node's bbolt bucket of what it applied; appliedKey holds the declaration's
// JSON as it was published.
var (
	bucket     = []byte("host")
	appliedKey = []byte("applied")
)

// Node events of the host: mesh.node.<node>.event.declaration.applied|refused.
const (
	EventApplied = "declaration.applied"
	EventRefused = "declaration.refused"
)

// Config is what a Follower needs of its node.
type Config struct {
	Node    string
	DB      *bolt.DB
	JS      jetstream.JetStream
	Servers deploy.ServerKey
	Log     *slog.Logger
	// Event publishes one of the node's own events (signed by the node): the audit log
	// records every declaration the node applied or refused.
	Event func(name string, meta map[string]any)
	// Apply makes the node run what d declares; it is called with each newer declaration
	// (the one applied before the node stopped is resumed by the caller: ReadApplied).
	Apply func(ctx context.Context, d deploy.Declaration)
	// Holder returns the mesh-controller seat's lease as this node's mirror has it: the node
	// holding it, its epoch and when that node took it (by its clock); ok is false when the
	// mirror has none.
	Holder func() (node string, epoch uint64, since time.Time, ok bool)
}

// Why a follow starts over (watchStuck).
var (
	errRemade = errors.New(manifest.StateStreamName + " was made again")
	errStuck  = errors.New("the follow has not delivered the newest declaration")
)

// checkEvery is how often a follower asks whether STATE was made again (lost, and recreated
// by a drift repair on any node: its ordered consumer would go on from the old stream's
// sequence, past everything the new one holds), and whether its follow is stuck (watchStuck):
// two requests to STATE a node every 2 s. At 5 s, and a whole interval more before a follow
// behind was called stuck, a deploy after two of five servers were killed waited 7–10 s for
// its host (the five-server fault bed).
const checkEvery = 2 * time.Second

// followHeartbeat is the heartbeat of the ordered consumer a follower reads its declaration
// with.
const followHeartbeat = time.Second

// holderWait bounds how long a declaration naming a controller epoch newer than the lease
// mirror's waits for the mirror before it is refused. The mirror lags the bucket by a few
// milliseconds, but by 10 s and more when the server its watch's consumer sat on is killed
// (nats.go's KV watch notices by a missed heartbeat and makes its consumer again): at 5 s a
// survivor of two servers killed refused its next declaration as not its controller's, and
// ran nothing new until the one after (the five-server fault bed).
const holderWait = 30 * time.Second

// Follower follows one node's declaration.
type Follower struct {
	cfg   Config
	check time.Duration // checkEvery, or a test's

	mu      sync.Mutex
	applied deploy.Declaration
	body    []byte // the applied declaration as published
}

// ReadApplied returns the declaration the node's store says it applied last (zero: none),
// without opening a Follower: what a starting node resumes before anything else is open.
func ReadApplied(db *bolt.DB) (deploy.Declaration, error) {
	var d deploy.Declaration
	err := db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucket); b != nil {
			if v := b.Get(appliedKey); v != nil {
				return json.Unmarshal(v, &d)
			}
		}
		return nil
	})
	return d, err
}

// Open reads the declaration the node applied last (none on a new node).
func Open(cfg Config) (*Follower, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	f := &Follower{cfg: cfg, check: checkEvery}
	err := cfg.DB.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		if v := b.Get(appliedKey); v != nil {
			f.body = bytes.Clone(v)
			return json.Unmarshal(v, &f.applied)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the applied declaration: %w", err)
	}
	return f, nil
}

// Applied returns the declaration the node applied last (zero: none).
func (f *Follower) Applied() deploy.Declaration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applied
}

// Run follows the node's subject on STATE until ctx ends, starting over after any failure of
// the bus.
func (f *Follower) Run(ctx context.Context) error {
	wait := backoff.Backoff{First: 200 * time.Millisecond, Max: 5 * time.Second}
	for {
		began := time.Now()
		err := f.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(began) > f.check {
			wait.Reset() // a follow that ran a while: its end is news, not the last retry's
		}
		f.cfg.Log.Warn("follow the node's declaration; trying again", "err", err)
		if wait.Wait(ctx) != nil {
			return nil
		}
	}
}

// follow reads the node's subject from its last message on, handling each, until the
// consumer fails or ctx ends.
func (f *Follower) follow(ctx context.Context) error {
	st, err := f.cfg.JS.Stream(ctx, manifest.StateStreamName)
	if err != nil {
		return err
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{manifest.StateSubject(f.cfg.Node)},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return err
	}
	// The ordered consumer is one copy on one server. Its heartbeat says when that server is
	// gone, and two missed make nats.go make it again elsewhere: at its 5 s default a
	// survivor of two servers killed sat behind its declaration for over 25 s.
	msgs, err := cons.Messages(jetstream.PullHeartbeat(followHeartbeat))
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, msgs.Stop)
	defer stop()
	var handled atomic.Uint64 // the stream sequence of the last declaration read
	stuck := make(chan error, 1)
	watchCtx, endWatch := context.WithCancel(ctx)
	defer endWatch()
	go func() {
		if err := f.watchStuck(watchCtx, st, st.CachedInfo().Created, &handled); err != nil {
			stuck <- err
			msgs.Stop()
		}
	}()
	for {
		m, err := msgs.Next()
		if err != nil {
			select {
			case err := <-stuck:
				if errors.Is(err, errStuck) {
					f.catchUp(ctx, st, handled.Load())
				}
				return err
			default:
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) && ctx.Err() != nil {
				return nil
			}
			return err
		}
		d := stored{subject: m.Subject(), header: m.Headers(), data: m.Data()}
		if meta, err := m.Metadata(); err == nil {
			d.seq = meta.Sequence.Stream
			handled.Store(d.seq)
		}
		f.handle(ctx, d)
	}
}

// stored is a declaration as STATE holds it: delivered by the follow, or read directly.
type stored struct {
	subject string
	header  nats.Header
	data    []byte
	seq     uint64 // its stream sequence; 0 if unknown
	newest  bool   // read as the newest STATE holds for the node: none newer to wait for
}

// catchUp handles the node's newest declaration, read with one get from STATE, when it is
// newer than handled: a follow found stuck starts over with an ordered consumer, whose every
// create nats.go waits 10 s for, and one sent while the stream elects its leader is never
// answered — a deploy waited 5–6 s more for its host that way after the stuck follow was
// found (the five-server fault bed). The get is asked again in short attempts
// (jsretry.Request) for up to a check interval: STATE serves no direct gets, so its leader
// answers, once elected. The follow made again delivers the same declaration, which is then
// left alone.
func (f *Follower) catchUp(ctx context.Context, st jetstream.Stream, handled uint64) {
	gctx, cancel := context.WithTimeout(ctx, f.check)
	defer cancel()
	var last *jetstream.RawStreamMsg
	if err := jsretry.Request(gctx, func(ctx context.Context) error {
		var err error
		last, err = st.GetLastMsgForSubject(ctx, manifest.StateSubject(f.cfg.Node))
		return err
	}); err != nil || last.Sequence <= handled {
		return
	}
	f.handle(ctx, stored{subject: last.Subject, header: last.Header, data: last.Data, seq: last.Sequence, newest: true})
}

// watchStuck checks every checkEvery that the follow can still get the node's next
// declaration, and says why not once it cannot (nil when ctx ends first): STATE is not the
// stream created at created (deleted, or deleted and made again); or the stream has held a
// newer declaration than the last one read (handled) from one check to the next, half an
// interval after the first found it. The second is an ordered consumer lost with its server
// and not made again yet: nats.go notices by missed heartbeats, then retries its create with
// waits growing to 10 s, each try bounded by 10 s more, while the stream elects its leader —
// a survivor of two servers killed sat behind its declaration for over 25 s (the
// seven-server fault bed). A follow said stuck that was only slow starts over from the
// node's last declaration, which it has applied already.
func (f *Follower) watchStuck(ctx context.Context, st jetstream.Stream, created time.Time, handled *atomic.Uint64) error {
	next := time.NewTimer(f.check)
	defer next.Stop()
	var behind uint64 // the newest stored sequence, when the last check found the follow behind it
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-next.C:
		}
		next.Reset(f.check)
		info, err := st.Info(ctx)
		if errors.Is(err, jetstream.ErrStreamNotFound) || (err == nil && !info.Created.Equal(created)) {
			return fmt.Errorf("%w: following it from its last declaration", errRemade)
		}
		last, err := st.GetLastMsgForSubject(ctx, manifest.StateSubject(f.cfg.Node))
		if err != nil || last.Sequence <= handled.Load() {
			behind = 0
			continue
		}
		if behind != 0 && handled.Load() < behind {
			return fmt.Errorf("%w: declaration %d was seen stored %s ago; following again", errStuck, behind, time.Since(since).Round(time.Millisecond))
		}
		behind, since = last.Sequence, time.Now()
		next.Reset(f.check / 2) // asked again sooner: a follow behind is read again, or started over
	}
}

// handle checks one declaration and applies it, or refuses it with an audited event. The
// declaration applied last, delivered again (at every start), is neither.
func (f *Follower) handle(ctx context.Context, m stored) {
	f.mu.Lock()
	applied, body := f.applied, f.body
	f.mu.Unlock()
	if bytes.Equal(m.data, body) {
		return
	}
	d, err := deploy.Check(f.cfg.Node, m.subject, m.header, m.data, f.cfg.Servers, applied)
	if errors.Is(err, deploy.ErrOlderEpoch) && f.holdsNow(ctx, d) {
		// Its signer holds the controller seat now, at d's epoch: the leases' bucket was
		// made again, and its epochs began again.
		f.cfg.Log.Info("declaration at an older controller epoch taken from the seat's holder", "revision", d.Revision, "epoch", d.Epoch, "applied_epoch", applied.Epoch)
		err = nil
	}
	if err != nil {
		f.cfg.Log.Warn("declaration refused", "revision", d.Revision, "applied", applied.Revision, "err", err)
		f.cfg.Event(EventRefused, map[string]any{"node": f.cfg.Node, "revision": d.Revision, "applied": applied.Revision,
			"signer": m.header.Get(envelope.Source), "reason": err.Error()})
		return
	}
	if err := f.heldBy(ctx, d); err != nil {
		f.cfg.Log.Warn("declaration refused", "revision", d.Revision, "applied", applied.Revision, "err", err)
		f.cfg.Event(EventRefused, map[string]any{"node": f.cfg.Node, "revision": d.Revision, "applied": applied.Revision,
			"signer": m.header.Get(envelope.Source), "reason": err.Error()})
		return
	}
	if !m.newest && f.superseded(ctx, m) {
		return // a newer one is on its way: this node never runs what is already replaced
	}
	if err := f.cfg.DB.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put(appliedKey, m.data) }); err != nil {
		f.cfg.Log.Error("record the applied declaration; it is applied again at the next start", "revision", d.Revision, "err", err)
	}
	f.mu.Lock()
	f.applied, f.body = d, bytes.Clone(m.data)
	f.mu.Unlock()
	modules := make([]string, len(d.Modules))
	for i, mod := range d.Modules {
		modules[i] = mod.Module + "@" + mod.Version
	}
	f.cfg.Log.Info("declaration applied", "revision", d.Revision, "controller", d.Controller, "epoch", d.Epoch, "modules", modules)
	f.cfg.Event(EventApplied, map[string]any{"node": f.cfg.Node, "revision": d.Revision, "epoch": d.Epoch,
		"controller": d.Controller, "modules": modules})
	f.cfg.Apply(ctx, d)
}

// superseded reports whether the stream (its leader, which has every write) holds a newer
// message on the node's subject than m: a consumer placed on a replica still catching up
// delivers what was replaced while the node was away, before the newest.
func (f *Follower) superseded(ctx context.Context, m stored) bool {
	if m.seq == 0 {
		return false
	}
	st, err := f.cfg.JS.Stream(ctx, manifest.StateStreamName)
	if err != nil {
		return false
	}
	last, err := st.GetLastMsgForSubject(ctx, m.subject)
	if err != nil {
		return false
	}
	if last.Sequence > m.seq {
		f.cfg.Log.Info("declaration skipped: a newer one is stored", "sequence", m.seq, "newest", last.Sequence)
		return true
	}
	return false
}

// holdsNow reports whether the mesh-controller seat's lease says d's controller holds the
// seat now, at d's epoch, and composed d while it did (after it took the lease, by its own
// clock: an epoch number of a bucket made again may repeat one a refused declaration
// carries); the mirror of the leases, which may lag, is waited for as heldBy does.
func (f *Follower) holdsNow(ctx context.Context, d deploy.Declaration) bool {
	return f.cfg.Holder != nil && f.pollHolder(ctx, func(node string, epoch uint64, since time.Time, ok bool) bool {
		return ok && node == d.Controller && epoch == d.Epoch && !d.Composed.Before(since)
	})
}

// pollHolder asks the leases' mirror for the controller seat's lease until decide has its
// answer, for at most holderWait (the mirror lags the bucket); false if it never had.
func (f *Follower) pollHolder(ctx context.Context, decide func(node string, epoch uint64, since time.Time, ok bool) bool) bool {
	deadline := time.Now().Add(holderWait)
	for {
		if decide(f.cfg.Holder()) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// heldBy checks d's controller against the mesh-controller seat's lease: the node that held
// the seat at d's epoch signed it. An epoch newer than the mirror's is waited for (the mirror
// lags); one the mirror never reaches, or an epoch the lease gives another node, is a
// forgery. An older epoch was a previous holder's, which no lease history can confirm: a
// revision newer than the applied one is the check that remains.
func (f *Follower) heldBy(ctx context.Context, d deploy.Declaration) error {
	if f.cfg.Holder == nil {
		return nil
	}
	var err error
	var seen uint64 // the mirror's epoch, last asked
	decided := f.pollHolder(ctx, func(node string, epoch uint64, _ time.Time, ok bool) bool {
		seen = epoch
		switch {
		case !ok:
			return true // no lease to say otherwise (the seat is between holders)
		case epoch == d.Epoch && node != d.Controller:
			err = fmt.Errorf("%w: epoch %d of the controller seat is %s's, and %s signed it", deploy.ErrForged, epoch, node, d.Controller)
			return true
		}
		return epoch >= d.Epoch
	})
	if !decided {
		return fmt.Errorf("%w: it names controller epoch %d, and the seat's lease is at %d", deploy.ErrForged, d.Epoch, seen)
	}
	return err
}
