package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/jsconsume"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
)

// The controller's side of the cascade: its consumer on EVENTS takes `pushed`, `built` and
// `failed`, and each cascade (started by a push, or by an artifact built outside one) is
// planned once by package build and advanced as its builds finish.

// cascadeConsumer is the controller's durable consumer of the cascade's events on EVENTS
// ("controller" is a reserved module name, so no module's consumer has it).
func cascadeConsumer() manifest.Consumer {
	return manifest.Consumer{
		Stream: manifest.EventsStreamName, Name: "controller",
		FilterSubjects: []string{
			manifest.SeatEventSubject(build.GitSeat, "pushed"),
			manifest.SeatEventSubject(build.BuilderSeat, "built"),
			manifest.SeatEventSubject(build.BuilderSeat, "failed"),
		},
		DeliverPolicy: manifest.DeliverNew, AckPolicy: manifest.AckExplicit,
		MaxAckPending: manifest.MaxAckPending, MaxDeliver: manifest.MaxDeliver, BackOff: manifest.BackOff(),
		DeadSubject: manifest.DeadSubject(manifest.EventsStreamName, "controller"),
	}
}

// maxBuilds bounds the builds `meshnode builds` remembers.
const maxBuilds = 1000

// cascades is the controller holder's state of the cascades under way.
type cascades struct {
	mu         sync.Mutex
	running    map[string]*cascade // by the id of the event that started it
	builds     []api.Build
	lastCommit map[string]string // repository → the commit last pushed
}

type cascade struct {
	id      string
	plan    build.Plan
	built   map[string]bool
	started map[string]bool
	commit  map[string]string // module → the commit to build it from
	trigger string
	causes  map[string]string // module → the event that made it ready (causation of its job)
}

// consumeCascade takes the cascade's events until ctx ends: while this node holds the
// controller seat.
func (c *Controller) consumeCascade(ctx context.Context) {
	con := cascadeConsumer()
	jsconsume.Run(ctx, jsconsume.Consumer{
		What: "the cascade's consumer",
		Log:  c.log,
		Get: func(ctx context.Context) (jetstream.Consumer, error) {
			return c.js.CreateOrUpdateConsumer(ctx, con.Stream, consumerConfig(con))
		},
		Handle: func(m jetstream.Msg) {
			if err := c.onCascadeEvent(ctx, m); err != nil {
				c.log.Warn("cascade event", "subject", m.Subject(), "err", err)
				m.Nak()
				return
			}
			m.Ack()
		},
	})
}

// onCascadeEvent handles one pushed, built or failed event, signed by the node that holds
// the seat it names (x-node, a server of the mesh).
func (c *Controller) onCascadeEvent(ctx context.Context, m jetstream.Msg) error {
	ev, err := envelope.Read(m.Subject(), m.Headers(), m.Data())
	if err != nil {
		m.TermWithReason(err.Error())
		return nil
	}
	id, ok := c.reg.Node(ev.Node)
	if !ok || envelope.Verify(m.Headers(), m.Subject(), m.Data(), id.PublicKey) != nil {
		m.TermWithReason("not signed by a server of the mesh")
		return nil
	}
	c.lock("cascade") // registrations and deployments do not change under a cascade's step
	defer c.mu.Unlock()
	switch m.Subject() {
	case manifest.SeatEventSubject(build.GitSeat, "pushed"):
		var p build.Pushed
		if json.Unmarshal(m.Data(), &p) != nil {
			return nil
		}
		return c.onPushed(ctx, ev.ID, p)
	case manifest.SeatEventSubject(build.BuilderSeat, "built"):
		var b build.Built
		if json.Unmarshal(m.Data(), &b) != nil {
			return nil
		}
		return c.onBuilt(ctx, ev.ID, b)
	case manifest.SeatEventSubject(build.BuilderSeat, "failed"):
		var f build.Failed
		if json.Unmarshal(m.Data(), &f) != nil {
			return nil
		}
		c.finish(f.Cascade, f.Module, "failed", "", "", f.Reason)
	}
	return nil
}

// onPushed starts a cascade from the modules built from the pushed repository whose path the
// push changed.
func (c *Controller) onPushed(ctx context.Context, eventID string, p build.Pushed) error {
	c.casc.mu.Lock()
	c.casc.lastCommit[p.Repository] = p.Commit
	c.casc.mu.Unlock()
	var roots []string
	var paths []string
	var asked bool
	catalogue := c.reg.Catalogue("")
	for _, m := range catalogue {
		if repo, path := m.BuildSource(); m.Built() && repo == p.Repository {
			if !asked {
				gctx, cancel := context.WithTimeout(ctx, build.GitToolTimeout+5*time.Second)
				r, err := build.CallGit(gctx, c.nc, "changed", api.ChangedRequest{Repository: p.Repository, Before: p.Before, Commit: p.Commit})
				cancel()
				if err != nil {
					return err // the event is delivered again
				}
				paths, asked = r.Paths, true
			}
			if build.Touches(paths, path) {
				roots = append(roots, m.Module)
			}
		}
	}
	if len(roots) == 0 {
		return nil
	}
	cs := &cascade{id: eventID, plan: build.FromCatalogue(catalogue).PlanFrom(roots...), built: map[string]bool{},
		started: map[string]bool{}, commit: map[string]string{}, causes: map[string]string{},
		trigger: "pushed " + p.Repository + " " + p.Ref}
	for _, r := range roots {
		cs.commit[r], cs.causes[r] = p.Commit, eventID
	}
	c.log.Info("cascade planned", "trigger", cs.trigger, "modules", cs.plan.Order)
	c.casc.mu.Lock()
	c.casc.running[eventID] = cs
	c.casc.mu.Unlock()
	return c.advance(ctx, cs)
}

// onBuilt records a build and advances its cascade — or, for an artifact built outside one,
// starts the cascade of what is built on it — and deploys it where its deployment says auto.
func (c *Controller) onBuilt(ctx context.Context, eventID string, b build.Built) error {
	c.casc.mu.Lock()
	cs := c.casc.running[b.Cascade]
	c.casc.mu.Unlock()
	if cs == nil {
		cs = &cascade{id: eventID, plan: build.FromCatalogue(c.reg.Catalogue("")).PlanFrom(b.Module), built: map[string]bool{},
			started: map[string]bool{b.Module: true}, commit: map[string]string{}, causes: map[string]string{},
			trigger: "built " + b.Module + " " + b.Version}
		c.casc.mu.Lock()
		c.casc.running[eventID] = cs
		c.casc.mu.Unlock()
	}
	c.finish(cs.id, b.Module, "built", b.Version, b.Digest, "")
	c.casc.mu.Lock()
	cs.built[b.Module] = true
	for _, m := range cs.plan.Order {
		if slices.Contains(cs.plan.Needs[m], b.Module) {
			cs.causes[m] = eventID
		}
	}
	c.casc.mu.Unlock()
	if e, ok := c.reg.Get(b.Module); ok && e.Deployment != nil && e.Deployment.Auto {
		d := *e.Deployment
		d.Version = b.Version
		if _, err := c.deployLocked(ctx, api.DeployRequest{Module: b.Module, Deployment: d}); err != nil {
			c.log.Error("deploy the new artifact", "module", b.Module, "version", b.Version, "err", err)
		}
	}
	return c.advance(ctx, cs)
}

// advance submits the cascade's builds that are ready, and forgets a cascade that is done.
func (c *Controller) advance(ctx context.Context, cs *cascade) error {
	c.casc.mu.Lock()
	ready := cs.plan.Ready(cs.built, cs.started)
	c.casc.mu.Unlock()
	for _, module := range ready {
		e, ok := c.reg.Get(module)
		if !ok || !e.Manifest.Built() {
			continue
		}
		repo, path := e.Manifest.BuildSource()
		c.casc.mu.Lock()
		commit := cs.commit[module]
		if commit == "" {
			commit = c.casc.lastCommit[repo]
		}
		cause := cs.causes[module]
		c.casc.mu.Unlock()
		if commit == "" {
			c.record(api.Build{Module: module, Status: "failed", Started: time.Now().UTC(), Finished: time.Now().UTC(),
				Trigger: cs.trigger, Cascade: cs.id, Reason: "no push of repository " + repo + " seen yet: its commit is unknown"})
			continue
		}
		job := build.Job{Module: module, Repository: repo, Path: path, Commit: commit, Reason: cs.trigger, Cascade: cs.id}
		if err := c.submitBuild(ctx, job, cause); err != nil {
			return err
		}
		c.casc.mu.Lock()
		cs.started[module] = true
		c.casc.mu.Unlock()
		c.record(api.Build{Module: module, Status: "queued", Commit: commit, Started: time.Now().UTC(),
			Trigger: cs.trigger, Cascade: cs.id, Cause: cause})
	}
	c.casc.mu.Lock()
	if len(cs.started) == len(cs.built) && len(cs.plan.Ready(cs.built, cs.started)) == 0 {
		delete(c.casc.running, cs.id) // done, or stopped at a failure
	}
	c.casc.mu.Unlock()
	return nil
}

// submitBuild queues one build job for the mesh-build-machine holder, signed by this node,
// caused by the event that made it ready.
func (c *Controller) submitBuild(ctx context.Context, job build.Job, cause string) error {
	body, _ := json.Marshal(job)
	if err := c.publish(ctx, manifest.SeatAcceptSubject(build.BuilderSeat, "build"), body, cause); err != nil {
		return fmt.Errorf("queue the build of %s: %w", job.Module, err)
	}
	return nil
}

// record keeps a build for `meshnode builds`.
func (c *Controller) record(b api.Build) {
	c.casc.mu.Lock()
	defer c.casc.mu.Unlock()
	c.casc.builds = append(c.casc.builds, b)
	if len(c.casc.builds) > maxBuilds {
		c.casc.builds = slices.Delete(c.casc.builds, 0, len(c.casc.builds)-maxBuilds)
	}
}

// finish marks the queued build of module in cascade as done.
func (c *Controller) finish(cascadeID, module, status, version, digest, reason string) {
	c.casc.mu.Lock()
	defer c.casc.mu.Unlock()
	for i := len(c.casc.builds) - 1; i >= 0; i-- {
		b := &c.casc.builds[i]
		if b.Module == module && b.Cascade == cascadeID && b.Status == "queued" {
			b.Status, b.Version, b.Digest, b.Reason, b.Finished = status, version, digest, reason, time.Now().UTC()
			return
		}
	}
	// Queued by another holder of the seat (this one took it over since): listed from now.
	c.casc.builds = append(c.casc.builds, api.Build{Module: module, Status: status, Version: version, Digest: digest,
		Reason: reason, Cascade: cascadeID, Finished: time.Now().UTC()})
}

// handleBuilds lists the latest builds; the one the builder says it runs (its status tool)
// is running rather than queued.
func (c *Controller) handleBuilds(ctx context.Context, _ []byte) any {
	var running api.BuilderStatus
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	if msg, err := c.nc.RequestWithContext(sctx, manifest.SeatToolSubject(build.BuilderSeat, "status"), nil); err == nil {
		json.Unmarshal(msg.Data, &running)
	}
	cancel()
	c.casc.mu.Lock()
	defer c.casc.mu.Unlock()
	out := slices.Clone(c.casc.builds)
	for i := range out {
		if out[i].Status == "queued" && out[i].Module == running.Module && out[i].Cascade == running.Cascade && running.Module != "" {
			out[i].Status = "running"
		}
	}
	return api.BuildsReply{Builds: out}
}
