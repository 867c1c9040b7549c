package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/registry"
	"github.com/nats-io/nats.go/jetstream"
)

// Deployment as state (DESIGN §12), the controller's side: `deploy` and `undeploy` change a
// module's deployment in its registry record, and the controller then composes the
// declaration of every node the change touches (package deploy) and publishes it on STATE.
// At start the controller declares every node again, so a node whose declaration a previous
// holder did not finish writing gets it.

// deployments is the controller's artifact store, opened on first use.
type deployments struct {
	mu  sync.Mutex
	obs jetstream.ObjectStore
}

// artifacts returns the artifact store, created with the mesh's replicas if need be.
func (c *Controller) artifacts(ctx context.Context) (jetstream.ObjectStore, error) {
	c.deps.mu.Lock()
	defer c.deps.mu.Unlock()
	if c.deps.obs != nil {
		return c.deps.obs, nil
	}
	obs, err := artifact.Open(ctx, c.js, c.topo.replicas())
	if err != nil {
		return nil, err
	}
	c.deps.obs = obs
	return obs, nil
}

// deploy sets a module's deployment: the module is registered, its artifact stored (its
// digest is taken from the store), every named node a server of the mesh. The nodes it ran
// on and runs on now get new declarations.
func (c *Controller) deploy(ctx context.Context, req api.DeployRequest) (api.DeployReply, error) {
	c.lock("deploy")
	defer c.mu.Unlock()
	return c.deployLocked(ctx, req)
}

// deployLocked is deploy under c.mu (the cascade deploys a new artifact while it holds it).
func (c *Controller) deployLocked(ctx context.Context, req api.DeployRequest) (api.DeployReply, error) {
	d := req.Deployment
	slices.Sort(d.Nodes)
	d.Nodes = slices.Compact(d.Nodes)
	if err := deploy.CheckDeployment(&d); err != nil {
		return api.DeployReply{}, fmt.Errorf("deploy %s: %w", req.Module, err)
	}
	e, ok := c.reg.Get(req.Module)
	if !ok {
		return api.DeployReply{}, fmt.Errorf("deploy: module %q is not registered; register it first (`meshnode module register`)", req.Module)
	}
	if !e.Derivation.Bus {
		return api.DeployReply{}, fmt.Errorf("deploy: module %s does not require mesh-bus, so it has no credentials to run with; add requires: [mesh-bus] and re-register", req.Module)
	}
	servers := c.reg.Nodes()
	for _, n := range d.Nodes {
		if !slices.Contains(servers, n) {
			return api.DeployReply{}, fmt.Errorf("deploy %s: %q is not a server of the mesh (it has %s; `meshnode members`)", req.Module, n, strings.Join(servers, ", "))
		}
	}
	obs, err := c.artifacts(ctx)
	if err != nil {
		return api.DeployReply{}, err
	}
	info, err := artifact.Stat(ctx, obs, req.Module, d.Version)
	if err != nil {
		return api.DeployReply{}, fmt.Errorf("deploy: %w; store it first: meshnode artifact put %s FILE --version %s", err, req.Module, d.Version)
	}
	d.Digest, d.Updated = info.Digest, time.Now().UTC()
	before := targets(e.Deployment, servers)
	rec := e.Record
	rec.Deployment = &d
	if err := c.putWithEvent(ctx, e, rec, registry.EventDeployed, map[string]any{
		"module": e.Module, "version": d.Version, "digest": d.Digest, "nodes": d.Nodes, "all": d.All, "instances": d.Instances, "node": c.node}); err != nil {
		return api.DeployReply{}, err
	}
	reply := api.DeployReply{Module: e.Module, Deployment: &d}
	reply.Declared = c.declare(ctx, union(before, targets(&d, servers)))
	c.wakeProvisions()
	c.collectArtifacts(ctx)
	return reply, nil
}

// undeploy stops a module on req.Nodes, or everywhere.
func (c *Controller) undeploy(ctx context.Context, req api.UndeployRequest) (api.DeployReply, error) {
	c.lock("undeploy")
	defer c.mu.Unlock()
	e, ok := c.reg.Get(req.Module)
	if !ok {
		return api.DeployReply{}, fmt.Errorf("undeploy: module %q is not registered", req.Module)
	}
	if e.Deployment == nil {
		return api.DeployReply{}, fmt.Errorf("undeploy: module %s is not deployed", req.Module)
	}
	servers := c.reg.Nodes()
	before := targets(e.Deployment, servers)
	var next *api.Deployment
	if len(req.Nodes) > 0 {
		for _, n := range req.Nodes {
			if !slices.Contains(before, n) {
				return api.DeployReply{}, fmt.Errorf("undeploy: module %s does not run on %q (it runs on %s)", req.Module, n, strings.Join(before, ", "))
			}
		}
		d := *e.Deployment
		d.All, d.Nodes = false, slices.DeleteFunc(slices.Clone(before), func(n string) bool { return slices.Contains(req.Nodes, n) })
		d.Updated = time.Now().UTC()
		if len(d.Nodes) > 0 {
			next = &d
		}
	}
	rec := e.Record
	rec.Deployment = next
	if err := c.putWithEvent(ctx, e, rec, registry.EventUndeployed, map[string]any{
		"module": e.Module, "nodes": req.Nodes, "node": c.node}); err != nil {
		return api.DeployReply{}, err
	}
	reply := api.DeployReply{Module: e.Module, Deployment: next}
	reply.Declared = c.declare(ctx, before)
	c.wakeProvisions()
	c.collectArtifacts(ctx)
	return reply, nil
}

// putWithEvent writes rec over e with one more event in its outbox.
func (c *Controller) putWithEvent(ctx context.Context, e *registry.Entry, rec registry.Record, action string, meta map[string]any) error {
	if len(rec.Outbox) >= outbox.Max {
		return fmt.Errorf("module %s has %d changes whose events are not recorded yet, and none is stored without its event: is EVENTS full or without a leader (`meshnode status`)?", e.Module, len(rec.Outbox))
	}
	ev, err := outbox.New(action, c.node, meta)
	if err != nil {
		return err
	}
	rec.Outbox = append(slices.Clone(rec.Outbox), ev)
	rec.Updated = time.Now().UTC()
	if _, err := c.reg.Put(ctx, rec, e.Revision); err != nil {
		return err
	}
	outbox.Wake(c.sweepNow)
	return nil
}

// targets are the servers d runs on.
func targets(d *api.Deployment, servers []string) []string {
	var out []string
	for _, n := range servers {
		if d.Targets(n) {
			out = append(out, n)
		}
	}
	return out
}

func union(a, b []string) []string {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

// deployed is every registered module with its deployment: what declarations compose from.
func (c *Controller) deployed() []deploy.Deployed {
	var out []deploy.Deployed
	for _, e := range c.reg.List() {
		if e.Deployment != nil {
			d := deploy.Deployed{Module: e.Module, PublicKey: e.PublicKey, Secrets: e.Manifest.Secrets, Deployment: e.Deployment, Limits: e.Manifest.Limits}
			d.Provisions, d.Waiting = c.provisionGate(e)
			out = append(out, d)
		}
	}
	return out
}

// declare composes and publishes the declaration of each of nodes; a node whose modules did
// not change keeps its declaration. A failure is reported per node and logged: the next
// change, or the next controller start, declares it again.
func (c *Controller) declare(ctx context.Context, nodes []string) []api.Declared {
	if c.publisher == nil {
		return nil
	}
	// One bound for them all: the nodes share STATE, and each declaration's requests ride
	// through its elections for jsretry.Patience (deploy.Publisher) — a sweep of every node
	// under c.mu, with STATE leaderless, would otherwise hold it that long a node.
	ctx, cancel := context.WithTimeout(ctx, jsretry.Patience)
	defer cancel()
	if err := c.loadProvisions(ctx); err != nil {
		// Composed without them, every module that requires anything would be declared
		// waiting, and stopped: nothing is declared until they are read.
		c.log.Error("declare: read the provisions", "err", err)
		return undeclared(nodes, "the provisions could not be read: "+err.Error())
	}
	epoch := c.epoch()
	if epoch == 0 {
		// The seat was lost meanwhile: a declaration at epoch 0 every host refuses, and the
		// next holder, finding the same modules declared, would leave it there.
		return undeclared(nodes, "this node no longer holds the controller seat; its next holder declares")
	}
	deployed := c.deployed()
	out := []api.Declared{}
	for _, n := range nodes {
		c.hostsMu.Lock()
		report := c.hosts[n]
		c.hostsMu.Unlock()
		applied := deploy.Applied{Revision: report.Revision, Reported: report.Time}
		d, changed, err := c.publisher.Publish(ctx, n, epoch, deploy.Compose(n, deployed), applied)
		r := api.Declared{Node: n, Revision: d.Revision, Changed: changed}
		if err == nil {
			c.hostsMu.Lock()
			c.published[n] = d
			c.hostsMu.Unlock()
		}
		if err != nil {
			r.Error = err.Error()
			c.log.Error("declare node", "target_node", n, "err", err)
		} else if changed {
			c.log.Info("node declared", "target_node", n, "revision", d.Revision, "modules", len(d.Modules))
		}
		out = append(out, r)
	}
	return out
}

// undeclared is declare's answer when it declares none of nodes, for why.
func undeclared(nodes []string, why string) []api.Declared {
	out := []api.Declared{}
	for _, n := range nodes {
		out = append(out, api.Declared{Node: n, Error: why})
	}
	return out
}

// redeclareEvery is how often the controller's holder checks every node's declaration on
// STATE: one a previous holder did not finish, or a forged or replayed message left last,
// is replaced by the genuine one within this.
const redeclareEvery = time.Minute

// keepDeclared declares every server of the mesh at once and then every redeclareEvery,
// while this node holds the controller seat (ctx); a server that joins meanwhile is declared
// when its identity reaches the registry. A deployment to every node (`deploy --all`) made
// before a node joined, or before its identity reached this node's mirror, was declared on
// it only at the next tick: a minute with nothing running.
func (c *Controller) keepDeclared(ctx context.Context) {
	tick := time.NewTicker(redeclareEvery)
	defer tick.Stop()
	nodes := c.reg.Nodes()
	known := map[string]bool{}
	for {
		for _, n := range nodes {
			known[n] = true
		}
		if len(nodes) > 0 {
			c.lock("declare every node")
			c.declare(ctx, nodes)
			c.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			nodes = c.reg.Nodes()
		case <-c.reg.NodesChanged():
			nodes, known = joined(c.reg.Nodes(), known)
		}
	}
}

// joined returns the servers of now that known does not hold, and now as the next known: a
// server removed and then joining again under its name is new again.
func joined(now []string, known map[string]bool) ([]string, map[string]bool) {
	var out []string
	next := make(map[string]bool, len(now))
	for _, n := range now {
		if !known[n] {
			out = append(out, n)
		}
		next[n] = true
	}
	return out, next
}

// collectArtifacts deletes the artifacts no deployment names that are not among their
// module's newest (DESIGN §3). Best effort, within collectFor: a failure waits for the next
// change.
func (c *Controller) collectArtifacts(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, collectFor)
	defer cancel()
	obs, err := c.artifacts(ctx)
	if err != nil {
		return
	}
	named := map[string]bool{}
	for _, e := range c.reg.List() {
		if e.Deployment != nil {
			named[artifact.Name(e.Module, e.Deployment.Version)] = true
		}
	}
	removed, err := artifact.Collect(ctx, obs, func(module, version string) bool { return named[artifact.Name(module, version)] })
	if err != nil && !errors.Is(err, context.Canceled) {
		c.log.Warn("collect artifacts", "err", err)
	}
	for _, a := range removed {
		c.log.Info("artifact collected", "module", a.Module, "version", a.Version, "digest", a.Digest)
	}
}

// collectFor bounds a collection of artifacts. It runs in a deploy's request, after the
// deployment is stored and declared: listing the store makes a consumer on its stream, and
// one asked for while the stream elects a leader is never answered — without a bound it would
// have taken the rest of the request's 30 s, and its answer with it.
const collectFor = 5 * time.Second

// handlePs answers what runs where: for each node's published declaration, each module's
// instances as the node last reported them ("unreported" until it has; "behind" while its
// applied revision is older than the published one).
func (c *Controller) handlePs(ctx context.Context, _ []byte) any {
	reply := api.PsReply{Processes: []api.Process{}}
	c.hostsMu.Lock()
	hosts, published := maps.Clone(c.hosts), maps.Clone(c.published)
	c.hostsMu.Unlock()
	for _, node := range c.reg.Nodes() {
		d, ok := published[node]
		if !ok {
			continue // not declared by this holder yet (keepDeclared does at once)
		}
		r, reported := hosts[node]
		for _, m := range d.Modules {
			i := slices.IndexFunc(r.Modules, func(mr host.ModuleReport) bool { return mr.Module == m.Module })
			row := api.Process{Module: m.Module, Node: node, Version: m.Version, Revision: r.Revision, Declared: d.Revision, Reported: r.Time}
			switch {
			case !reported:
				row.State = "unreported"
			case i < 0 || r.Modules[i].Version != m.Version:
				row.State = "behind"
			}
			if row.State != "" {
				reply.Processes = append(reply.Processes, row)
				continue
			}
			mr := r.Modules[i]
			if len(mr.Instances) == 0 {
				row.State, row.Reason = mr.State, mr.Reason
				reply.Processes = append(reply.Processes, row)
				continue
			}
			for n, in := range mr.Instances {
				p := row
				p.Instance, p.State, p.PID, p.Restarts, p.Since, p.Reason, p.Isolation = n, in.State, in.PID, in.Restarts, in.Since, in.Reason, in.Isolation
				reply.Processes = append(reply.Processes, p)
			}
		}
	}
	return reply
}
