package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

// The build cascade (DESIGN §7, §12) on a node: as holder of mesh-git (a node with
// git-repos) it notices new commits and emits `pushed`, and serves `archive` and `changed`
// (Git); as holder of mesh-build-machine (builder: true) it runs `build` jobs and emits
// `built` or `failed` (Builder). The mesh-controller's holder turns `pushed` into build jobs
// and `built` into the rebuilds of exactly the modules downstream (PlanFrom), and deploys a
// new artifact where the deployment says auto.

// The mesh's own seats of the cascade, their verbs, tools and events.
const (
	// GitSeat is the seat of the node that serves the mesh's repositories.
	GitSeat = "mesh-git"
	// BuilderSeat is the seat of the node that runs the mesh's builds.
	BuilderSeat = "mesh-build-machine"

	// SourcesBucket is the object store of source archives the mesh-git holder exports for
	// builders, by repository and commit (DESIGN §3: 7 days).
	SourcesBucket = "mesh-sources"
	sourcesTTL    = 7 * 24 * time.Hour

	// GitNotifyTool is the node tool a post-receive hook pokes (`meshnode git notify`).
	GitNotifyTool = "git-notify"
	// gitCheckEvery is how often the mesh-git holder looks at its repositories' heads, so
	// nothing is missed across restarts and without a hook.
	gitCheckEvery = 30 * time.Second
	// buildTimeout bounds one build.
	buildTimeout = 10 * time.Minute
	// buildCacheDir, in the data dir, holds the builder's caches (Go's build and module
	// caches, npm's), one for each module's builds, kept between builds and written by
	// builds alone: never the node's.
	buildCacheDir = "build-cache"
	// buildUser and the module's name are the key of the uid a module's builds run as, when
	// the node is root (no module's name starts with @).
	buildUser = "@build:"
	// GitToolTimeout bounds one archive or changed request on the mesh-git holder; a
	// caller's request waits a little longer, then tries again.
	GitToolTimeout = 20 * time.Second
)

// errClosed is Start's after Close: the node is stopping.
var errClosed = errors.New("the seat's service is closed: the node is stopping")

// sourceObject is a commit's archive's name in mesh-sources.
func sourceObject(repository, commit string) string { return repository + "/" + commit + ".tar" }

var gitBucket = []byte("git") // bbolt: "<repository> <ref>" → the commit last told

// publish stores seat's event with body.
func (c *Config) publish(ctx context.Context, seat, event string, body any, causation string) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	return c.Publish(ctx, seat, manifest.SeatEventSubject(seat, event), b, causation)
}

// sources opens mesh-sources, which the controller makes: looked up, not updated, so that a
// source can be stored while a server of the mesh is away (an update of an R3 stream's
// configuration waits for its peers).
func (c *Config) sources(ctx context.Context) (jetstream.ObjectStore, error) {
	obs, err := c.JetStream.ObjectStore(ctx, SourcesBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return CreateSources(ctx, c.JetStream, c.Replicas())
	}
	return obs, err
}

// CreateSources creates or updates mesh-sources.
func CreateSources(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.ObjectStore, error) {
	return ensure.ObjectStore(ctx, js, jetstream.ObjectStoreConfig{
		Bucket: SourcesBucket, Description: "meshnode: source archives for builders, by repository and commit",
		TTL: sourcesTTL, Storage: jetstream.FileStorage, Replicas: replicas,
	})
}

// Git is the mesh-git seat's work on a node: while the node holds the seat (Start to Stop) it
// tells pushes and serves archive and changed; from OpenGit to Close it answers the node's
// git-notify tool.
type Git struct {
	cfg    Config
	run    *seatRun
	poke   chan struct{}
	notify *nats.Subscription
	subs   []*nats.Subscription // the seat's tools while it is held; guarded by run.mu
}

// OpenGit serves the node's git-notify tool; ctx is the parent of everything the service
// starts, until Close.
func OpenGit(ctx context.Context, cfg Config) (*Git, error) {
	g := &Git{cfg: cfg, run: newSeatRun(ctx), poke: make(chan struct{}, 1)}
	sub, err := cfg.Responder.Subscribe(manifest.NodeToolSubject(cfg.Node, GitNotifyTool), g.serveNotify)
	if err != nil {
		g.run.wait()
		return nil, fmt.Errorf("serve the %s tool: %w", GitNotifyTool, err)
	}
	g.notify = sub
	return g, nil
}

// Start serves the seat: the node holds it.
func (g *Git) Start() error {
	g.run.mu.Lock()
	defer g.run.mu.Unlock()
	if g.run.closed {
		return errClosed
	}
	if g.run.stop != nil {
		return nil
	}
	for tool, h := range map[string]func(context.Context, []byte) api.GitReply{"archive": g.archive, "changed": g.changed} {
		sub, err := g.cfg.Responder.QueueSubscribe(manifest.SeatToolSubject(GitSeat, tool), GitSeat, func(m *nats.Msg) {
			// Each request on its own: an archive stuck on a stream whose leader went away
			// must not hold up the next (which a builder's retry sends). One in progress when
			// the seat moves is finished: its builder waits for it.
			g.run.spawn(func(ctx context.Context) {
				ctx, cancel := context.WithTimeout(ctx, GitToolTimeout)
				defer cancel()
				b, _ := json.Marshal(h(ctx, m.Data))
				m.Respond(b)
			})
		})
		if err != nil {
			return err
		}
		g.subs = append(g.subs, sub)
	}
	g.run.start(func(ctx context.Context) {
		tick := time.NewTicker(gitCheckEvery)
		defer tick.Stop()
		for {
			g.check(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case <-g.poke:
			}
		}
	})
	return g.cfg.Responder.Flush()
}

// Stop stops serving the seat: the node no longer holds it. Its check loop is not waited
// for (the next Start's waits for it, and Close does).
func (g *Git) Stop() {
	g.run.mu.Lock()
	defer g.run.mu.Unlock()
	g.stop()
}

// stop is Stop with run.mu held.
func (g *Git) stop() {
	for _, s := range g.subs {
		s.Unsubscribe()
	}
	g.subs = nil
	g.run.stopRun()
}

// Close stops serving the seat and the git-notify tool, ends what is in progress and waits
// for it.
func (g *Git) Close() error {
	g.run.mu.Lock()
	g.stop()
	g.run.close()
	g.run.mu.Unlock()
	err := g.notify.Unsubscribe()
	g.run.wait()
	return err
}

// serveNotify answers the node's git-notify tool (the operator's, or a post-receive hook's
// `meshnode git notify`): the mesh-git holder on this node looks at its repositories now.
func (g *Git) serveNotify(m *nats.Msg) {
	reply := api.GitReply{}
	var req api.ArchiveRequest // the repository alone
	json.Unmarshal(m.Data, &req)
	if _, ok := g.cfg.GitRepos[req.Repository]; !ok {
		served := "none"
		if len(g.cfg.GitRepos) > 0 {
			served = strings.Join(slices.Sorted(maps.Keys(g.cfg.GitRepos)), ", ")
		}
		reply.Error = fmt.Sprintf("it serves no repository %q (its git-repos: %s); give the node git-repos: {%s: /path/to/%s.git} (or --git-repos %s=PATH) and restart it", req.Repository, served, req.Repository, req.Repository, req.Repository)
	} else {
		select {
		case g.poke <- struct{}{}:
		default:
		}
	}
	b, _ := json.Marshal(reply)
	m.Respond(b)
}

// check emits `pushed` for each branch whose head moved since it was last told.
func (g *Git) check(ctx context.Context) {
	log := g.cfg.Logger
	for _, repo := range slices.Sorted(maps.Keys(g.cfg.GitRepos)) {
		heads, err := Heads(ctx, g.cfg.GitRepos[repo])
		if err != nil {
			log.Warn("read a repository's heads", "repository", repo, "err", err)
			continue
		}
		for _, ref := range slices.Sorted(maps.Keys(heads)) {
			key := []byte(repo + " " + ref)
			var before string
			g.cfg.DB.View(func(tx *bolt.Tx) error {
				if b := tx.Bucket(gitBucket); b != nil {
					before = string(b.Get(key))
				}
				return nil
			})
			if before == heads[ref] {
				continue
			}
			p := Pushed{Repository: repo, Ref: ref, Commit: heads[ref], Before: before}
			if err := g.cfg.publish(ctx, GitSeat, "pushed", p, ""); err != nil {
				log.Warn("tell a push; told again at the next check", "repository", repo, "ref", ref, "err", err)
				continue
			}
			g.cfg.DB.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists(gitBucket)
				if err != nil {
					return err
				}
				return b.Put(key, []byte(heads[ref]))
			})
			log.Info("pushed", "repository", repo, "ref", ref, "commit", heads[ref], "before", before)
		}
	}
}

func (g *Git) archive(ctx context.Context, data []byte) api.GitReply {
	var req api.ArchiveRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return api.GitReply{Error: "not JSON"}
	}
	dir, ok := g.cfg.GitRepos[req.Repository]
	if !ok {
		return api.GitReply{Error: fmt.Sprintf("this mesh-git holder serves no repository %q", req.Repository)}
	}
	obs, err := g.cfg.sources(ctx)
	if err != nil {
		return api.GitReply{Error: err.Error()}
	}
	name := sourceObject(req.Repository, req.Commit)
	if _, err := obs.GetInfo(ctx, name); err == nil {
		return api.GitReply{Object: name}
	}
	pr, pw := io.Pipe()
	archived := make(chan struct{})
	go func() {
		defer close(archived)
		pw.CloseWithError(Archive(ctx, dir, req.Commit, pw))
	}()
	_, err = obs.Put(ctx, jetstream.ObjectMeta{Name: name}, pr)
	pr.CloseWithError(err) // a failed store stops git archive's writes
	<-archived
	if err != nil {
		return api.GitReply{Error: err.Error()}
	}
	return api.GitReply{Object: name}
}

func (g *Git) changed(ctx context.Context, data []byte) api.GitReply {
	var req api.ChangedRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return api.GitReply{Error: "not JSON"}
	}
	dir, ok := g.cfg.GitRepos[req.Repository]
	if !ok {
		return api.GitReply{Error: fmt.Sprintf("this mesh-git holder serves no repository %q", req.Repository)}
	}
	paths, err := Changed(ctx, dir, req.Before, req.Commit)
	if err != nil {
		return api.GitReply{Error: err.Error()}
	}
	return api.GitReply{Paths: paths}
}

// CallGit asks the mesh-git holder's tool (archive or changed) and decodes its reply.
func CallGit(ctx context.Context, nc *nats.Conn, tool string, req any) (api.GitReply, error) {
	b, _ := json.Marshal(req)
	msg, err := nc.RequestWithContext(ctx, manifest.SeatToolSubject(GitSeat, tool), b)
	if err != nil {
		return api.GitReply{}, fmt.Errorf("ask mesh-git for %s: %w", tool, err)
	}
	var r api.GitReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return api.GitReply{}, err
	}
	if r.Error != "" {
		return r, errors.New(r.Error)
	}
	return r, nil
}

// Builder is the mesh-build-machine seat's work on a node: while the node holds the seat
// (Start to Stop) it takes build jobs one at a time and answers the status tool.
type Builder struct {
	cfg Config
	run *seatRun
	sub *nats.Subscription // the status tool; guarded by run.mu
	// current is the build running now (status); zero between builds.
	currentMu sync.Mutex
	current   api.BuilderStatus
}

// OpenBuilder returns the seat's service, idle until Start; ctx is the parent of everything
// it starts, until Close.
func OpenBuilder(ctx context.Context, cfg Config) *Builder {
	return &Builder{cfg: cfg, run: newSeatRun(ctx)}
}

// Start serves the seat: the node holds it.
func (b *Builder) Start() error {
	b.run.mu.Lock()
	defer b.run.mu.Unlock()
	if b.run.closed {
		return errClosed
	}
	if b.run.stop != nil {
		return nil
	}
	sub, err := b.cfg.Responder.QueueSubscribe(manifest.SeatToolSubject(BuilderSeat, "status"), BuilderSeat, func(m *nats.Msg) {
		b.currentMu.Lock()
		st := b.current
		b.currentMu.Unlock()
		out, _ := json.Marshal(st)
		m.Respond(out)
	})
	if err != nil {
		return err
	}
	b.sub = sub
	b.run.start(b.consume)
	return b.cfg.Responder.Flush()
}

// Stop stops serving the seat: the node no longer holds it. The build in progress is ended
// and its job handed back, not waited for (the next Start's run waits for it, and Close
// does).
func (b *Builder) Stop() {
	b.run.mu.Lock()
	defer b.run.mu.Unlock()
	b.stop()
}

// stop is Stop with run.mu held.
func (b *Builder) stop() {
	if b.sub != nil {
		b.sub.Unsubscribe()
		b.sub = nil
	}
	b.run.stopRun()
}

// Close stops serving the seat, ends the build in progress and waits for it.
func (b *Builder) Close() error {
	b.run.mu.Lock()
	b.stop()
	b.run.close()
	b.run.mu.Unlock()
	b.run.wait()
	return nil
}

// consume takes build jobs one at a time until ctx ends.
func (b *Builder) consume(ctx context.Context) {
	con, ok, err := manifest.Builtin().SeatConsumer(BuilderSeat, b.cfg.Node)
	if err != nil || !ok {
		b.cfg.Logger.Error("the build queue is not derived", "err", err)
		return
	}
	wait := backoff.Backoff{First: 200 * time.Millisecond, Max: 5 * time.Second}
	var cons jetstream.Consumer
	for {
		if cons, err = b.cfg.JetStream.Consumer(ctx, con.Stream, con.Name); err == nil {
			break
		}
		if wait.Wait(ctx) != nil {
			return
		}
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			if wait.Wait(ctx) != nil {
				return
			}
			continue
		}
		for m := range batch.Messages() {
			b.build(ctx, m)
		}
	}
}

// build runs one job and tells how it went; the job is acked once its event is out.
func (b *Builder) build(ctx context.Context, m jetstream.Msg) {
	log := b.cfg.Logger
	ev, err := envelope.Read(m.Subject(), m.Headers(), m.Data())
	var job Job
	if err == nil {
		key, ok := b.cfg.NodeKey(ev.Source)
		switch {
		case !ok:
			err = fmt.Errorf("a build job from %q, which is no server of the mesh", ev.Source)
		case envelope.Verify(m.Headers(), m.Subject(), m.Data(), key) != nil:
			err = errors.New("a build job whose signature is not its server's")
		default:
			err = json.Unmarshal(m.Data(), &job)
		}
	}
	if err != nil {
		log.Warn("build job refused", "err", err)
		m.TermWithReason(err.Error())
		return
	}
	// Kept in progress while it runs: a build outlasts the queue's ack wait.
	progress, stopProgress := context.WithCancel(ctx)
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-progress.Done():
				return
			case <-t.C:
				m.InProgress()
			}
		}
	}()
	b.setCurrent(api.BuilderStatus{Module: job.Module, Commit: job.Commit, Cascade: job.Cascade, Since: time.Now().UTC()})
	built, failure, transient := b.runJob(ctx, job)
	b.setCurrent(api.BuilderStatus{})
	stopProgress()
	<-progressDone
	if transient != nil && ctx.Err() == nil {
		// Not the build's fault (a stream electing a leader, a seat between holders): the job
		// is tried again, and after the queue's delivery limit it is a dead letter.
		log.Warn("build interrupted; tried again", "module", job.Module, "err", transient)
		m.NakWithDelay(2 * time.Second)
		return
	}
	if ctx.Err() != nil {
		// Stopping (the seat moves): the next holder gets the job at once. A builder that
		// dies instead has it redelivered when the queue's ack wait runs out.
		m.Nak()
		return
	}
	// built and failed carry the job's cause (the pushed or built event that queued it), so
	// that the audit log's events chain from the push to the last rebuild.
	cause := m.Headers().Get(envelope.Causation)
	if failure != nil {
		failure.Cascade = job.Cascade
		log.Warn("build failed", "module", job.Module, "commit", job.Commit, "reason", failure.Reason)
		if err := b.cfg.publish(ctx, BuilderSeat, "failed", failure, cause); err != nil {
			m.Nak()
			return
		}
	} else {
		built.Cascade = job.Cascade
		log.Info("built", "module", built.Module, "version", built.Version, "digest", built.Digest)
		if err := b.cfg.publish(ctx, BuilderSeat, "built", built, cause); err != nil {
			m.Nak()
			return
		}
	}
	m.Ack()
}

// setCurrent records the build running now, for the status tool.
func (b *Builder) setCurrent(st api.BuilderStatus) {
	b.currentMu.Lock()
	b.current = st
	b.currentMu.Unlock()
}

// runJob builds one job: the module's source from mesh-git, its build.on artifacts, the
// command; the artifact is stored as version <commit[:12]> (with its upstreams' digests
// folded in, so a rebuild on new upstreams is a new version). A failure of the build is
// Failed; one of the mesh around it (fetching, storing) is transient, to try again.
func (b *Builder) runJob(ctx context.Context, job Job) (*Built, *Failed, error) {
	cfg := &b.cfg
	fail := func(reason string, log []byte) (*Built, *Failed, error) {
		return nil, &Failed{Module: job.Module, Commit: job.Commit, Reason: reason, Log: Tail(log)}, nil
	}
	retry := func(err error) (*Built, *Failed, error) { return nil, nil, err }
	man, ok := cfg.Manifest(job.Module)
	if !ok || !man.Built() {
		return fail("module "+job.Module+" is not registered with a build.from", nil)
	}
	gctx, cancel := context.WithTimeout(ctx, GitToolTimeout+5*time.Second)
	defer cancel()
	if _, err := CallGit(gctx, cfg.Conn, "archive", api.ArchiveRequest{Repository: job.Repository, Commit: job.Commit}); err != nil {
		return retry(err)
	}
	src, err := cfg.sources(ctx)
	if err != nil {
		return retry(err)
	}
	dir, err := os.MkdirTemp(filepath.Join(cfg.DataDir), "build-")
	if err != nil {
		return retry(err)
	}
	defer os.RemoveAll(dir)
	source, err := os.Create(filepath.Join(dir, "source.tar"))
	if err != nil {
		return retry(err)
	}
	defer source.Close()
	if err := artifact.ReadObject(ctx, cfg.JetStream, src, SourcesBucket, sourceObject(job.Repository, job.Commit), source); err != nil {
		return retry(fmt.Errorf("fetch the source: %w", err))
	}
	if _, err := source.Seek(0, io.SeekStart); err != nil {
		return retry(err)
	}
	arts, err := artifact.Lookup(ctx, cfg.JetStream)
	if err != nil {
		return retry(err)
	}
	deps := map[string]io.Reader{}
	var upstream []string
	for _, on := range man.BuildOn {
		list, err := artifact.List(ctx, arts, on)
		if err != nil || len(list) == 0 {
			return fail("no artifact of "+on+", which "+job.Module+" is built on", nil)
		}
		var buf strings.Builder
		if err := artifact.Fetch(ctx, cfg.JetStream, arts, on, list[0].Version, list[0].Digest, &buf); err != nil {
			return retry(err)
		}
		deps[on] = strings.NewReader(buf.String())
		upstream = append(upstream, list[0].Digest)
	}
	// Each module's builds have a cache and (as root) a uid of their own: a repository's
	// build that rewrote a shared GOMODCACHE would be linked into every other module's.
	spec := Spec{Job: job, Run: man.BuildRun, Source: source, Deps: deps, Timeout: buildTimeout,
		Sandbox: cfg.Sandbox, Cache: filepath.Join(cfg.DataDir, buildCacheDir, job.Module), Read: cfg.Read,
		Limits: cfg.Limits}
	if cfg.Users != nil {
		if spec.User, err = cfg.Users.For(buildUser + job.Module); err != nil {
			return retry(err)
		}
	}
	out, log, err := Run(ctx, dir, spec)
	if err != nil {
		return fail(err.Error(), log)
	}
	version := job.Commit[:12]
	if len(upstream) > 0 {
		version += "-" + strings.TrimPrefix(digestOf(strings.Join(upstream, ",")), "sha256:")[:8]
	}
	info, err := artifact.Put(ctx, arts, job.Module, version, out)
	if errors.Is(err, artifact.ErrExists) {
		return fail("version "+version+" is stored with other content: the build is not reproducible", log)
	}
	if err != nil {
		return retry(fmt.Errorf("store the artifact: %w", err))
	}
	return &Built{Module: job.Module, Version: info.Version, Digest: info.Digest, Commit: job.Commit}, nil, nil
}

// digestOf is the sha256:<hex> of s.
func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}
