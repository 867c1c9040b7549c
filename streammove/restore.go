package streammove

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
	"time"

	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// restoreTimeout bounds one attempt at restoring a stream, and restoreAttempts how many
// are made, from restorePause apart doubling to 10 times that (a minute in all), before
// Restore fails (and the caller's next start goes on).
const (
	restoreTimeout  = 2 * time.Minute
	restoreAttempts = 10
	restorePause    = time.Second
)

// apiWait bounds each JetStream request of a restore but the snapshot's upload and the
// waits for replicas (see restoreStream). A variable for a test.
var apiWait = 10 * time.Second

// RestoringMeta marks a stream's configuration from its restore until its messages are
// checked against the snapshot's and it and its consumers are caught up: an interrupted
// move's next Restore compares a marked stream again, and whoever waits for a stream to be
// moved (the nodes that join a growing one wait for the registry) waits for its mark to go.
const RestoringMeta = "meshnode.restoring"

// Restore restores s from the snapshots in dir (SnapshotAll's) into js, at replicas, as
// restoreStream does, again after a growing pause when an attempt fails, up to
// restoreAttempts times. Not jsretry.Request's short attempts at one request: a restore
// is several requests, and one cut short may still complete — the next attempt finds the
// stream and checks it. Nor is a failure always the cluster's: nats-server removes a deleted
// stream's files, and an emptied streams directory, in the background, and a restore of the
// same name at once failed now and then in 2.15.2 ("could not create storage directory",
// "expected sequence does not match store"); the next attempt went through.
//
// A stream already restored whole by an earlier call (one whose caller was interrupted) is
// kept as it is. lost are the snapshot's durable consumers the cluster never registered
// (logged too): their owners make them again.
func Restore(ctx context.Context, log *slog.Logger, nc *nats.Conn, js jetstream.JetStream, dir string, s Stream, replicas int) (lost []string, err error) {
	pause := backoff.Backoff{First: restorePause, Max: 10 * restorePause}
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, restoreTimeout)
		lost, err = restoreStream(actx, nc, js, dir, s, replicas)
		cancel()
		if err == nil {
			if len(lost) > 0 {
				log.Warn("restored without consumers the mesh never registered; the mesh's own are made again, their deliveries from the start",
					"stream", s.Config.Name, "consumers", lost, "waited", registerWait)
			}
			return lost, nil
		}
		if ctx.Err() != nil || attempt == restoreAttempts {
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
func restoreStream(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, dir string, s Stream, replicas int) (lost []string, err error) {
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
		if info.Config.Replicas == replicas && info.Config.Metadata[RestoringMeta] == "" {
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
		s.Config.Metadata[RestoringMeta] = "true"
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
	if _, marked := cfg.Metadata[RestoringMeta]; marked {
		delete(cfg.Metadata, RestoringMeta)
		if err := update(cfg); err != nil {
			return nil, fmt.Errorf("mark %s restored: %w", name, err)
		}
	}
	return lost, nil
}

// restoredHook, when set (by a test), is called as a stream's restore has been answered,
// before it is checked: an error returned ends the attempt there.
var restoredHook func(stream string) error

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
func restoreSnapshot(ctx context.Context, nc *nats.Conn, dir string, s Stream) error {
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
