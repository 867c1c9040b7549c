package node

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

	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sandbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

// The build cascade (DESIGN §7, §12) on a node: as holder of mesh-git (a node with
// git-repos) it notices new commits and emits `pushed`, and serves `archive` and `changed`;
// as holder of mesh-build-machine (builder: true) it runs `build` jobs and emits `built` or
// `failed`; as holder of mesh-controller it turns `pushed` into build jobs and `built` into
// the rebuilds of exactly the modules downstream (package build plans them), and deploys a
// new artifact where the deployment says auto.

// The mesh's own seats of the cascade, their verbs, tools and events.
const (
	GitSeat     = build.GitSeat
	BuilderSeat = build.BuilderSeat

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
	// gitToolTimeout bounds one archive or changed request on the mesh-git holder; a
	// builder's request waits a little longer, then tries again.
	gitToolTimeout = 20 * time.Second
)

// ArchiveRequest asks the mesh-git holder to put a commit's tree into mesh-sources.
type ArchiveRequest struct {
	Repository string `json:"repository"`
	Commit     string `json:"commit"`
}

// ChangedRequest asks which paths commit changed since before.
type ChangedRequest struct {
	Repository string `json:"repository"`
	Before     string `json:"before,omitempty"`
	Commit     string `json:"commit"`
}

// GitReply answers both: the object name, or the paths.
type GitReply struct {
	Object string   `json:"object,omitempty"`
	Paths  []string `json:"paths,omitempty"`
	Error  string   `json:"error,omitempty"`
}

// sourceObject is a commit's archive's name in mesh-sources.
func sourceObject(repository, commit string) string { return repository + "/" + commit + ".tar" }

var gitBucket = []byte("git") // bbolt: "<repository> <ref>" → the commit last told

// publishSeatEvent publishes an event of one of the mesh's own seats this node holds,
// signed by the node, with x-source the seat.
func (n *Node) publishSeatEvent(ctx context.Context, seat, event string, body any, causation string) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	return publishSigned(ctx, n.bus.JetStream(), n.sign, seat, n.id.Name, manifest.SeatEventSubject(seat, event), b, causation)
}

// publishSigned stamps body for subject — x-source source, x-node node, signed by key,
// caused by causation ("": none) — and publishes it to JetStream, waiting for the stream's
// ack at most 5 s: the node's own events, jobs and reports.
func publishSigned(ctx context.Context, js jetstream.JetStream, key envelope.Signer, source, node, subject string, body []byte, causation string) error {
	h, err := envelope.Stamp(key, source, node, subject, body, envelope.Options{Causation: causation})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: body}); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return nil
}

// sources opens mesh-sources, which the controller makes (reconcileAll): looked up, not
// updated, so that a source can be stored while a server of the mesh is away (an update of
// an R3 stream's configuration waits for its peers).
func (n *Node) sources(ctx context.Context) (jetstream.ObjectStore, error) {
	obs, err := n.bus.JetStream().ObjectStore(ctx, SourcesBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return createSources(ctx, n.bus.JetStream(), n.replicas())
	}
	return obs, err
}

// createSources creates or updates mesh-sources.
func createSources(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.ObjectStore, error) {
	return ensure.ObjectStore(ctx, js, jetstream.ObjectStoreConfig{
		Bucket: SourcesBucket, Description: "meshnode: source archives for builders, by repository and commit",
		TTL: sourcesTTL, Storage: jetstream.FileStorage, Replicas: replicas,
	})
}

// gitService is the mesh-git seat's work on this node, while it holds the seat.
type gitService struct {
	n      *Node
	mu     sync.Mutex
	subs   []*nats.Subscription
	cancel context.CancelFunc
	wg     sync.WaitGroup
	poke   chan struct{}
}

func (g *gitService) start() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cancel != nil {
		return nil
	}
	n := g.n
	for tool, h := range map[string]func(context.Context, []byte) GitReply{"archive": g.archive, "changed": g.changed} {
		sub, err := n.respNC.QueueSubscribe(manifest.SeatToolSubject(GitSeat, tool), GitSeat, func(m *nats.Msg) {
			// Each request on its own: an archive stuck on a stream whose leader went away
			// must not hold up the next (which a builder's retry sends).
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), gitToolTimeout)
				defer cancel()
				b, _ := json.Marshal(h(ctx, m.Data))
				m.Respond(b)
			}()
		})
		if err != nil {
			return err
		}
		g.subs = append(g.subs, sub)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
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
	}()
	return n.respNC.Flush()
}

func (g *gitService) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.subs {
		s.Unsubscribe()
	}
	g.subs = nil
	if g.cancel != nil {
		g.cancel() // not waited for: stop runs in the seat's hooks (close waits)
		g.cancel = nil
	}
}

func (g *gitService) close() { g.stop(); g.wg.Wait() }

// check emits `pushed` for each branch whose head moved since it was last told.
func (g *gitService) check(ctx context.Context) {
	n := g.n
	for _, repo := range slices.Sorted(maps.Keys(n.cfg.GitRepos)) {
		heads, err := build.Heads(ctx, n.cfg.GitRepos[repo])
		if err != nil {
			n.log.Warn("read a repository's heads", "repository", repo, "err", err)
			continue
		}
		for _, ref := range slices.Sorted(maps.Keys(heads)) {
			key := []byte(repo + " " + ref)
			var before string
			n.db.View(func(tx *bolt.Tx) error {
				if b := tx.Bucket(gitBucket); b != nil {
					before = string(b.Get(key))
				}
				return nil
			})
			if before == heads[ref] {
				continue
			}
			p := build.Pushed{Repository: repo, Ref: ref, Commit: heads[ref], Before: before}
			if err := n.publishSeatEvent(ctx, GitSeat, "pushed", p, ""); err != nil {
				n.log.Warn("tell a push; told again at the next check", "repository", repo, "ref", ref, "err", err)
				continue
			}
			n.db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists(gitBucket)
				if err != nil {
					return err
				}
				return b.Put(key, []byte(heads[ref]))
			})
			n.log.Info("pushed", "repository", repo, "ref", ref, "commit", heads[ref], "before", before)
		}
	}
}

func (g *gitService) archive(ctx context.Context, data []byte) GitReply {
	var req ArchiveRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return GitReply{Error: "not JSON"}
	}
	dir, ok := g.n.cfg.GitRepos[req.Repository]
	if !ok {
		return GitReply{Error: fmt.Sprintf("this mesh-git holder serves no repository %q", req.Repository)}
	}
	obs, err := g.n.sources(ctx)
	if err != nil {
		return GitReply{Error: err.Error()}
	}
	name := sourceObject(req.Repository, req.Commit)
	if _, err := obs.GetInfo(ctx, name); err == nil {
		return GitReply{Object: name}
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(build.Archive(ctx, dir, req.Commit, pw)) }()
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: name}, pr); err != nil {
		pr.CloseWithError(err)
		return GitReply{Error: err.Error()}
	}
	return GitReply{Object: name}
}

func (g *gitService) changed(ctx context.Context, data []byte) GitReply {
	var req ChangedRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return GitReply{Error: "not JSON"}
	}
	dir, ok := g.n.cfg.GitRepos[req.Repository]
	if !ok {
		return GitReply{Error: fmt.Sprintf("this mesh-git holder serves no repository %q", req.Repository)}
	}
	paths, err := build.Changed(ctx, dir, req.Before, req.Commit)
	if err != nil {
		return GitReply{Error: err.Error()}
	}
	return GitReply{Paths: paths}
}

// gitCall asks the mesh-git holder's tool and decodes its reply.
func gitCall(ctx context.Context, nc *nats.Conn, tool string, req any) (GitReply, error) {
	b, _ := json.Marshal(req)
	msg, err := nc.RequestWithContext(ctx, manifest.SeatToolSubject(GitSeat, tool), b)
	if err != nil {
		return GitReply{}, fmt.Errorf("ask mesh-git for %s: %w", tool, err)
	}
	var r GitReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return GitReply{}, err
	}
	if r.Error != "" {
		return r, errors.New(r.Error)
	}
	return r, nil
}

// builderService is the mesh-build-machine seat's work on this node, while it holds it.
type builderService struct {
	n      *Node
	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sub    *nats.Subscription // the status tool
	// current is the build running now (status); zero between builds.
	current BuilderStatus
}

// BuilderStatus answers the mesh-build-machine seat's status tool: the build running now.
type BuilderStatus struct {
	Module  string    `json:"module,omitempty"`
	Commit  string    `json:"commit,omitempty"`
	Cascade string    `json:"cascade,omitempty"`
	Since   time.Time `json:"since,omitzero"`
}

func (b *builderService) start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		return nil
	}
	sub, err := b.n.respNC.QueueSubscribe(manifest.SeatToolSubject(BuilderSeat, "status"), BuilderSeat, func(m *nats.Msg) {
		b.mu.Lock()
		st := b.current
		b.mu.Unlock()
		out, _ := json.Marshal(st)
		m.Respond(out)
	})
	if err != nil {
		return err
	}
	b.sub = sub
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.consume(ctx)
	}()
	return b.n.respNC.Flush()
}

func (b *builderService) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sub != nil {
		b.sub.Unsubscribe()
		b.sub = nil
	}
	if b.cancel != nil {
		b.cancel()
		b.cancel = nil
	}
}

func (b *builderService) close() { b.stop(); b.wg.Wait() }

// consume takes build jobs one at a time until ctx ends.
func (b *builderService) consume(ctx context.Context) {
	n := b.n
	con, ok, err := manifest.Builtin().SeatConsumer(BuilderSeat, n.id.Name)
	if err != nil || !ok {
		n.log.Error("the build queue is not derived", "err", err)
		return
	}
	wait := backoff.Backoff{First: 200 * time.Millisecond, Max: 5 * time.Second}
	var cons jetstream.Consumer
	for {
		if cons, err = n.bus.JetStream().Consumer(ctx, con.Stream, con.Name); err == nil {
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
func (b *builderService) build(ctx context.Context, m jetstream.Msg) {
	n := b.n
	ev, err := envelope.Read(m.Subject(), m.Headers(), m.Data())
	var job build.Job
	if err == nil {
		id, ok := n.reg.Node(ev.Source)
		switch {
		case !ok:
			err = fmt.Errorf("a build job from %q, which is no server of the mesh", ev.Source)
		case envelope.Verify(m.Headers(), m.Subject(), m.Data(), id.PublicKey) != nil:
			err = errors.New("a build job whose signature is not its server's")
		default:
			err = json.Unmarshal(m.Data(), &job)
		}
	}
	if err != nil {
		n.log.Warn("build job refused", "err", err)
		m.TermWithReason(err.Error())
		return
	}
	// Kept in progress while it runs: a build outlasts the queue's ack wait.
	progress, stopProgress := context.WithCancel(ctx)
	go func() {
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
	b.mu.Lock()
	b.current = BuilderStatus{Module: job.Module, Commit: job.Commit, Cascade: job.Cascade, Since: time.Now().UTC()}
	b.mu.Unlock()
	built, failure, transient := b.run(ctx, job)
	b.mu.Lock()
	b.current = BuilderStatus{}
	b.mu.Unlock()
	stopProgress()
	if transient != nil && ctx.Err() == nil {
		// Not the build's fault (a stream electing a leader, a seat between holders): the job
		// is tried again, and after the queue's delivery limit it is a dead letter.
		n.log.Warn("build interrupted; tried again", "module", job.Module, "err", transient)
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
		n.log.Warn("build failed", "module", job.Module, "commit", job.Commit, "reason", failure.Reason)
		if err := n.publishSeatEvent(ctx, BuilderSeat, "failed", failure, cause); err != nil {
			m.Nak()
			return
		}
	} else {
		built.Cascade = job.Cascade
		n.log.Info("built", "module", built.Module, "version", built.Version, "digest", built.Digest)
		if err := n.publishSeatEvent(ctx, BuilderSeat, "built", built, cause); err != nil {
			m.Nak()
			return
		}
	}
	m.Ack()
}

// run builds one job: the module's source from mesh-git, its build.on artifacts, the
// command; the artifact is stored as version <commit[:12]> (with its upstreams' digests
// folded in, so a rebuild on new upstreams is a new version). A failure of the build is
// Failed; one of the mesh around it (fetching, storing) is transient, to try again.
func (b *builderService) run(ctx context.Context, job build.Job) (*build.Built, *build.Failed, error) {
	n := b.n
	fail := func(reason string, log []byte) (*build.Built, *build.Failed, error) {
		return nil, &build.Failed{Module: job.Module, Commit: job.Commit, Reason: reason, Log: build.Tail(log)}, nil
	}
	retry := func(err error) (*build.Built, *build.Failed, error) { return nil, nil, err }
	e, ok := n.reg.Get(job.Module)
	if !ok || !e.Manifest.Built() {
		return fail("module "+job.Module+" is not registered with a build.from", nil)
	}
	gctx, cancel := context.WithTimeout(ctx, gitToolTimeout+5*time.Second)
	defer cancel()
	if _, err := gitCall(gctx, n.bus.Conn(), "archive", ArchiveRequest{Repository: job.Repository, Commit: job.Commit}); err != nil {
		return retry(err)
	}
	src, err := n.sources(ctx)
	if err != nil {
		return retry(err)
	}
	dir, err := os.MkdirTemp(filepath.Join(n.cfg.DataDir), "build-")
	if err != nil {
		return retry(err)
	}
	defer os.RemoveAll(dir)
	source, err := os.Create(filepath.Join(dir, "source.tar"))
	if err != nil {
		return retry(err)
	}
	defer source.Close()
	if err := artifact.ReadObject(ctx, n.bus.JetStream(), src, SourcesBucket, sourceObject(job.Repository, job.Commit), source); err != nil {
		return retry(fmt.Errorf("fetch the source: %w", err))
	}
	if _, err := source.Seek(0, io.SeekStart); err != nil {
		return retry(err)
	}
	arts, err := artifact.Lookup(ctx, n.bus.JetStream())
	if err != nil {
		return retry(err)
	}
	deps := map[string]io.Reader{}
	var upstream []string
	for _, on := range e.Manifest.BuildOn {
		list, err := artifact.List(ctx, arts, on)
		if err != nil || len(list) == 0 {
			return fail("no artifact of "+on+", which "+job.Module+" is built on", nil)
		}
		var buf strings.Builder
		if err := artifact.Fetch(ctx, n.bus.JetStream(), arts, on, list[0].Version, list[0].Digest, &buf); err != nil {
			return retry(err)
		}
		deps[on] = strings.NewReader(buf.String())
		upstream = append(upstream, list[0].Digest)
	}
	// Each module's builds have a cache and (as root) a uid of their own: a repository's
	// build that rewrote a shared GOMODCACHE would be linked into every other module's.
	spec := build.Spec{Job: job, Run: e.Manifest.BuildRun, Source: source, Deps: deps, Timeout: buildTimeout,
		Sandbox: n.sandbox, Cache: filepath.Join(n.cfg.DataDir, buildCacheDir, job.Module), Read: n.cfg.BuildPaths,
		Limits: sandbox.Limits{Memory: int64(n.cfg.ModuleMemory), Processes: n.cfg.ModuleProcesses, Disk: int64(n.cfg.ModuleDisk)}}
	if n.moduleUsers != nil {
		if spec.User, err = n.moduleUsers.For(buildUser + job.Module); err != nil {
			return retry(err)
		}
	}
	out, log, err := build.Run(ctx, dir, spec)
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
	return &build.Built{Module: job.Module, Version: info.Version, Digest: info.Digest, Commit: job.Commit}, nil, nil
}

// digestOf is the sha256:<hex> of s.
func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// serveGitNotify answers the node's git-notify tool (the operator's, or a post-receive hook's
// `meshnode git notify`): the mesh-git holder on this node looks at its repositories now.
func (n *Node) serveGitNotify() (*nats.Subscription, error) {
	return n.respNC.Subscribe(manifest.NodeToolSubject(n.id.Name, GitNotifyTool), func(m *nats.Msg) {
		reply := GitReply{}
		var req ArchiveRequest // the repository alone
		json.Unmarshal(m.Data, &req)
		switch _, ok := n.cfg.GitRepos[req.Repository]; {
		case !ok:
			served := "none"
			if len(n.cfg.GitRepos) > 0 {
				served = strings.Join(slices.Sorted(maps.Keys(n.cfg.GitRepos)), ", ")
			}
			reply.Error = fmt.Sprintf("it serves no repository %q (its git-repos: %s); give the node git-repos: {%s: /path/to/%s.git} (or --git-repos %s=PATH) and restart it", req.Repository, served, req.Repository, req.Repository, req.Repository)
		case n.seats == nil || n.seats.git == nil:
			reply.Error = "this node does not run the mesh-git seat"
		default:
			select {
			case n.seats.git.poke <- struct{}{}:
			default:
			}
		}
		b, _ := json.Marshal(reply)
		m.Respond(b)
	})
}
