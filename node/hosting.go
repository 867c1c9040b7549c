package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/controller"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/internal/backoff"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sandbox"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// hosting is what runs this node's modules: the follower of its declaration, the
// supervisor of its processes and the sandbox they run in.
type hosting struct {
	host       *host.Follower   // this node's declaration
	supervisor *host.Supervisor // the modules it runs
	sandbox    *sandbox.Sandbox // isolates its modules and builds (DESIGN §13)
	users      *sandbox.Users   // the uid each module runs as, when the node is root
	busUp      chan struct{}    // closed once the bus is open: what the supervisor fetches waits for it
	reportNow  chan struct{}    // the supervisor's state changed: report it
}

// The node as a host (DESIGN §12): the follower (host.Follower) hands each declaration it
// takes to the supervisor (host.Supervisor), which fetches artifacts from mesh-artifacts and
// credentials from the vault and runs the modules; the reporter tells the mesh-controller
// role how that went, as `report` jobs signed by this node.

// reportEvery is how often a host reports even when nothing changed: a controller that took
// the seat over learns what runs where within this.
const reportEvery = 30 * time.Second

// openSandbox opens what isolates the node's modules and builds (DESIGN §13) and says at
// start what full isolation lacks on this machine. A node running as root gives each module
// a uid of its own, and its data dir is passed through by them (0711), never listed; an
// unprivileged node's data dir is its own alone (0700).
func (n *Node) openSandbox() error {
	cfg := sandbox.Config{Isolation: n.cfg.Isolation, Name: sandbox.SubtreeName(n.id.Name, n.cfg.DataDir), Cgroup: n.cfg.Cgroup, Log: n.log.With("component", "sandbox")}
	mode := os.FileMode(0o700)
	if above := unpassable(n.cfg.DataDir); os.Geteuid() == 0 && above != "" {
		// A root node runs nothing as root (sandbox.Start says why), and its modules' own
		// uids cannot reach their directories through above.
		cfg.NoUsers = fmt.Sprintf("%s lets no other user pass, so no module's own uid reaches its directory in %s; chmod o+x %s, or use a data dir under a directory others may pass (e.g. /var/lib/meshnode)", above, n.cfg.DataDir, above)
		n.log.Error("modules and builds will not start: " + cfg.NoUsers)
	} else if os.Geteuid() == 0 {
		mode = 0o711
		first, last, err := n.cfg.UIDRange()
		if err != nil {
			return err
		}
		if first == 0 {
			first, last = sandbox.NodeUIDs(n.cfg.DataDir)
		}
		if cfg.Users, err = sandbox.OpenUsers(filepath.Join(n.cfg.DataDir, usersFile), first, last); err != nil {
			return fmt.Errorf("module users: %w", err)
		}
	}
	if err := os.Chmod(n.cfg.DataDir, mode); err != nil {
		return err
	}
	sb, err := sandbox.Open(cfg)
	if err != nil {
		return fmt.Errorf("open the sandbox: %w", err)
	}
	n.mods.sandbox, n.mods.users = sb, cfg.Users
	n.closers.Push("sandbox", sb.Close)
	if none := sb.Unenforceable(); len(none) > 0 {
		n.log.Warn("module limits the kernel will not hold here: no cgroup controller for them (a v2 cgroup with them enabled, or run the node as root)", "limits", strings.Join(none, ", "))
	}
	if missing := sb.Missing(); len(missing) > 0 {
		if err := sb.Check(); err != nil {
			n.log.Error("modules and builds will not start: "+err.Error(), "isolation", n.cfg.Isolation)
		} else {
			n.log.Warn("modules and builds run with reduced isolation", "missing", strings.Join(missing, "; "))
		}
	}
	return nil
}

// unpassable returns the first directory above dir that users other than its owner may not
// pass through (no o+x), or "".
func unpassable(dir string) string {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		if st, err := os.Stat(p); err == nil && st.Mode().Perm()&0o001 == 0 {
			return p
		}
		if p == "/" || p == "." {
			return ""
		}
	}
}

// usersFile records the uid each module runs as (sandbox.Users).
const usersFile = "module-users.json"

// newSupervisor makes the node's supervisor of modules.
func (n *Node) newSupervisor() {
	n.mods.busUp = make(chan struct{})
	n.mods.supervisor = &host.Supervisor{
		Sandbox: n.mods.sandbox,
		Users:   n.mods.users,
		Limits:  api.Limits{Memory: int64(n.cfg.ModuleMemory), Processes: n.cfg.ModuleProcesses, Disk: int64(n.cfg.ModuleDisk)},
		Dir:     filepath.Join(n.cfg.DataDir, "modules"),
		Node:    n.id.Name,
		URL:     fixedClientURL(n.cfg.ClientAddr),
		CA:      n.clientCAFile(),
		Log:     n.log.With("component", "host"),
		Artifact: func(ctx context.Context, m deploy.Module, w io.Writer) error {
			if err := n.waitBus(ctx); err != nil {
				return err
			}
			obs, err := artifact.Lookup(ctx, n.bus.JetStream())
			if err != nil {
				return err
			}
			return artifact.Fetch(ctx, n.bus.JetStream(), obs, m.Module, m.Version, m.Digest, w)
		},
		Credentials: n.moduleCredentials,
		Changed: func() {
			select {
			case n.mods.reportNow <- struct{}{}:
			default:
			}
		},
	}
	n.closers.PushFunc("modules", n.mods.supervisor.Stop) // the modules stop with their node
}

// fixedClientURL is the URL the bus will answer on when addr fixes its port ("" when the port
// is chosen at start): nats-server's ClientURL, which names loopback for an unspecified host.
func fixedClientURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "0" || port == "" {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "nats://" + net.JoinHostPort(host, port)
}

// waitBus waits until the bus is open: a module the node resumes before its bus, whose files
// on disk are not complete, is prepared once it is.
func (n *Node) waitBus(ctx context.Context) error {
	select {
	case <-n.mods.busUp:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// resume starts the modules of the declaration this node applied last, from disk.
func (n *Node) resume(ctx context.Context) {
	d, err := host.ReadApplied(n.db)
	if err != nil {
		n.log.Error("read the applied declaration; its modules start when the controller declares them again", "err", err)
		return
	}
	if d.Revision > 0 {
		n.mods.supervisor.Resume(ctx, d)
	}
}

// apply hands a declaration to the supervisor.
func (n *Node) apply(ctx context.Context, d deploy.Declaration) {
	start := time.Now()
	n.mods.supervisor.Apply(ctx, d)
	n.metrics.meter.Apply.Observe(time.Since(start).Seconds())
}

// moduleCredentials asks the vault for a module's seed and secrets, sealed to this node's
// xkey: the vault gives them only to a node whose declaration runs the module.
func (n *Node) moduleCredentials(ctx context.Context, m deploy.Module) (*api.ModuleCredentials, error) {
	if err := n.waitBus(ctx); err != nil {
		return nil, err
	}
	xkp, err := n.found.NodeXKey()
	if err != nil {
		return nil, err
	}
	xpub, _ := xkp.PublicKey()
	var out api.ModuleCredentials
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := vault.CallWith(ctx, n.bus.Conn(), xkp, api.VaultVerbModule, api.VaultCallerNode, api.VaultRequest{XKey: xpub, Node: n.id.Name, Owner: m.Module}, &out); err != nil {
		return nil, err
	}
	if out.PublicKey != m.PublicKey {
		return nil, fmt.Errorf("the vault sent the seed of key %s, and the declaration names %s", out.PublicKey, m.PublicKey)
	}
	return &out, nil
}

// declared is the vault's check of what node runs: its declaration on STATE, signed by a
// server of the mesh.
func (n *Node) declared(ctx context.Context, node, module string) (vault.DeclaredModule, bool) {
	d, _, _, err := deploy.Last(ctx, n.bus.JetStream(), node, n.serverKey)
	if err != nil || d.Revision == 0 {
		return vault.DeclaredModule{}, false // none, or no genuine one
	}
	m, ok := d.Module(module)
	if !ok {
		return vault.DeclaredModule{}, false
	}
	out := vault.DeclaredModule{PublicKey: m.PublicKey, Secrets: m.Secrets}
	for _, p := range m.Provisions {
		if p.Provider != deploy.MeshProvider { // the mesh's own (kv) need no credential
			out.Provisions = append(out.Provisions, p.Interface)
		}
	}
	return out, true
}

// serverKey returns a server of the mesh's public key.
func (n *Node) serverKey(name string) (string, bool) {
	id, ok := n.reg.Node(name)
	return id.PublicKey, ok
}

// runReports sends the supervisor's report to the mesh-controller role whenever it changes,
// and every reportEvery, until ctx ends; a report that cannot be sent is retried (a newer
// one replaces it).
func (n *Node) runReports(ctx context.Context) error {
	subject := manifest.SeatAcceptSubject(manifest.ControllerSeat, controller.ReportVerb)
	tick := time.NewTicker(reportEvery)
	defer tick.Stop()
	wait := backoff.Backoff{First: 200 * time.Millisecond, Max: 5 * time.Second}
	for {
		// The supervisor's revision, not the follower's: the follower records a declaration
		// before the supervisor has stopped what it replaces.
		r := n.mods.supervisor.Report()
		body, _ := json.Marshal(r)
		err := n.sendReport(ctx, subject, body)
		switch {
		case err == nil:
			wait.Reset()
		case ctx.Err() != nil:
			return nil
		default:
			n.log.Warn("report to the controller; trying again", "err", err)
			if wait.Wait(ctx) != nil {
				return nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-n.mods.reportNow:
		case <-tick.C:
		}
	}
}

// sendReport publishes one report job, signed by this node.
func (n *Node) sendReport(ctx context.Context, subject string, body []byte) error {
	return publishSigned(ctx, n.bus.JetStream(), n.sign, n.id.Name, n.id.Name, subject, body, envelope.Options{})
}

// publishSigned stamps body for subject — x-source source, x-node node, signed by key,
// caused by causation ("": none) — and publishes it to JetStream, waiting for the stream's
// ack at most 5 s: the node's own events, jobs and reports.
func publishSigned(ctx context.Context, js jetstream.JetStream, key envelope.Signer, source, node, subject string, body []byte, opts envelope.Options) error {
	h, err := envelope.Stamp(key, source, node, subject, body, opts)
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

// serveLogs answers the node's logs tool (the operator's: the responder answers only into
// its inbox).
func (n *Node) serveLogs() (*nats.Subscription, error) {
	return n.resp.nc.Subscribe(manifest.NodeToolSubject(n.id.Name, api.LogsTool), func(m *nats.Msg) {
		var req api.LogsRequest
		reply := api.LogsReply{}
		if err := json.Unmarshal(m.Data, &req); err != nil {
			reply.Error = "the request is not JSON"
		} else if r, err := host.ReadLog(n.mods.supervisor.Dir, req); err != nil {
			reply.Error = err.Error()
		} else {
			reply = r
		}
		b, _ := json.Marshal(reply)
		m.Respond(b)
	})
}
