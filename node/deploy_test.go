package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// sleeper is an artifact that says where it runs, then waits to be stopped.
const sleeper = "#!/bin/sh\necho \"started $MESH_NODE instance $MESH_INSTANCE v=%s\"\nexec sleep 600\n"

// putArtifact stores content as module's version through the operator's connection.
func (b *bed) putArtifact(module, version, content string) artifact.Info {
	b.t.Helper()
	path := filepath.Join(b.t.TempDir(), module+"-"+version)
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	obs, err := artifact.Lookup(ctx, b.js)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := artifact.Put(ctx, obs, module, version, path)
	if err != nil {
		b.t.Fatal(err)
	}
	return info
}

// deploy deploys module's version on alpha.
func (b *bed) deploy(module, version string) api.DeployReply {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := admin.Deploy(ctx, b.op, api.DeployRequest{Module: module, Deployment: api.Deployment{Version: version, Nodes: []string{"alpha"}, Instances: 1}})
	if err != nil {
		b.t.Fatalf("deploy %s %s: %v", module, version, err)
	}
	return r
}

// ticker registers module ticker and stores its versions 1 and 2.
func (b *bed) ticker() {
	b.t.Helper()
	b.register("module: ticker\nrequires: [mesh-bus]\n")
	b.putArtifact("ticker", "1", fmt.Sprintf(sleeper, "1"))
	b.putArtifact("ticker", "2", fmt.Sprintf(sleeper, "2"))
}

// ps returns the controller's `ps` rows of module.
func (b *bed) ps(module string) []api.Process {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	all, err := admin.Ps(ctx, b.op)
	if err != nil {
		b.t.Fatal(err)
	}
	var out []api.Process
	for _, p := range all {
		if p.Module == module {
			out = append(out, p)
		}
	}
	return out
}

// running waits until module runs one process at version and returns it.
func (b *bed) running(t testing.TB, module, version string, notPID int) api.Process {
	t.Helper()
	var p api.Process
	retryUntil(t, 20*time.Second, func() error {
		ps := b.ps(module)
		if len(ps) != 1 || ps[0].State != host.StateRunning || ps[0].PID == 0 || ps[0].PID == notPID || ps[0].Version != version {
			return fmt.Errorf("ps %+v", ps)
		}
		p = ps[0]
		return nil
	})
	return p
}

// TestDeploy_RunsRestartsAndUndeploys: a deployed artifact runs on its node with its
// credentials (0600, the module's own seed) and the host's environment; killed, it is
// restarted; its output is readable through the node's logs tool; undeployed, it stops and
// its credentials leave the disk. The seed is in no stream.
func TestDeploy_RunsRestartsAndUndeploys(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seedFile, _ := b.register("module: ticker\nrequires: [mesh-bus]\nemits: [tick]\nsecrets: [api-token]\n")
	var token api.Secret
	if _, err := b.vault(api.VaultVerbMint, api.VaultRequest{Owner: "ticker", Name: "api-token"}, &token); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := admin.Deploy(ctx, b.op, api.DeployRequest{Module: "ticker", Deployment: api.Deployment{Version: "1", Nodes: []string{"alpha"}, Instances: 1}}); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "artifact put ticker") {
		t.Fatalf("deploy without an artifact: %v, want a refusal saying to put it", err)
	}
	b.putArtifact("ticker", "1", fmt.Sprintf(sleeper, "1"))
	if _, err := admin.Deploy(ctx, b.op, api.DeployRequest{Module: "ticker", Deployment: api.Deployment{Version: "1", Nodes: []string{"omega"}, Instances: 1}}); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "not a server") {
		t.Fatalf("deploy to an unknown node: %v", err)
	}
	// The vault keeps the module's seed for its hosts, and gives it to none yet: no
	// declaration runs the module. Nor does the operator read it, or see it listed.
	kv, err := b.js.KeyValue(ctx, registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "identity.node.alpha")
	if err != nil {
		t.Fatal(err)
	}
	var alpha registry.NodeIdentity
	json.Unmarshal(e.Value(), &alpha)
	if _, err := vault.CallWith(ctx, b.op, nil, api.VaultVerbModule, api.VaultCallerNode, api.VaultRequest{XKey: alpha.XKey, Node: "alpha", Owner: "ticker"}, nil); err == nil || !strings.Contains(err.Error(), "does not run module ticker") {
		t.Fatalf("a module's credentials for a node that does not run it: %v", err)
	}
	if _, err := b.vault(api.VaultVerbFetch, api.VaultRequest{Owner: "ticker", Name: vault.SeedName}, &api.Secret{}); err == nil || !strings.Contains(err.Error(), "mesh's own") {
		t.Fatalf("the operator's fetch of a module's seed: %v", err)
	}
	if metas, err := b.vault(api.VaultVerbList, api.VaultRequest{Owner: "ticker"}, nil); err != nil || len(metas) != 1 || metas[0].Name != "api-token" {
		t.Fatalf("vault ls: %+v %v, want api-token alone", metas, err)
	}
	r := b.deploy("ticker", "1")
	if len(r.Declared) != 1 || !r.Declared[0].Changed || r.Declared[0].Node != "alpha" {
		t.Fatalf("deploy reply %+v", r)
	}
	p := b.running(t, "ticker", "1", 0)
	// examples/ticker runs sandboxed (DESIGN §13): ps says so from the kernel's word.
	if iso := p.Isolation; iso == nil || !iso.NoNewPrivs || iso.Landlock == "none" || iso.Cgroup == "" || iso.CapEff != "0000000000000000" {
		t.Fatalf("the ticker's isolation %+v, want no_new_privs, Landlock, a cgroup, no capabilities", iso)
	}
	if status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID)); !bytes.Contains(status, []byte("NoNewPrivs:\t1")) {
		t.Fatalf("the ticker's status:\n%s", status)
	}

	dir := filepath.Join(b.dir, "modules", "ticker")
	creds := filepath.Join(dir, "creds.nk")
	st, err := os.Stat(creds)
	wantMode, wantUser := os.FileMode(0o600), "the node's"
	if os.Geteuid() == 0 { // a root node's module runs as a uid of its own, which alone reads it
		wantMode, wantUser = 0o400, strings.TrimPrefix(p.Isolation.User, "uid ")
	}
	if err != nil || st.Mode().Perm() != wantMode {
		t.Fatalf("credentials %v %v, want a %o file", st, err, wantMode)
	}
	if uid := fmt.Sprint(st.Sys().(*syscall.Stat_t).Uid); os.Geteuid() == 0 && uid != wantUser {
		t.Fatalf("credentials owned by uid %s, want the module's (%s)", uid, wantUser)
	}
	want, _ := os.ReadFile(seedFile)
	got, _ := os.ReadFile(creds)
	if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
		t.Fatal("the host's credentials are not the module's seed")
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.PID))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{"MESH_URL=" + b.n.ClientURL(), "MESH_CREDS=" + creds, "MESH_NODE=alpha"} {
		if !bytes.Contains(environ, []byte(kv+"\x00")) {
			t.Errorf("the process's environment lacks %s", kv)
		}
	}
	var logs api.LogsReply
	retryUntil(t, 5*time.Second, func() error {
		msg, err := b.op.Request(manifest.NodeToolSubject("alpha", api.LogsTool), []byte(`{"module":"ticker","offset":0}`), 5*time.Second)
		if err != nil {
			return err
		}
		json.Unmarshal(msg.Data, &logs)
		if !strings.Contains(string(logs.Data), "started alpha instance 0 v=1") {
			return fmt.Errorf("logs %q %s", logs.Data, logs.Error)
		}
		return nil
	})

	// kill -9: restarted, counted.
	if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	again := b.running(t, "ticker", "1", p.PID)
	if again.Restarts < 1 {
		t.Fatalf("restarted without a count: %+v", again)
	}

	// Its secret reached it as a file; neither the secret nor the seed is in any stream or
	// store file (STATE's declarations name secrets only).
	if got, err := os.ReadFile(filepath.Join(dir, "secrets", "api-token")); err != nil || string(got) != token.Value {
		t.Fatalf("the secret's file: %q %v", got, err)
	}
	b.assertNotStored(t, map[string][]byte{"module seed": bytes.TrimSpace(want), "secret": []byte(token.Value)})

	ctxU, cancelU := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelU()
	if _, err := admin.Undeploy(ctxU, b.op, api.UndeployRequest{Module: "ticker"}); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		if ps := b.ps("ticker"); len(ps) > 0 {
			return fmt.Errorf("still in ps: %+v", ps)
		}
		if err := syscall.Kill(again.PID, 0); err == nil {
			return fmt.Errorf("process %d still runs", again.PID)
		}
		if _, err := os.Stat(dir); err == nil {
			return errors.New("its directory (with its credentials) is still on disk")
		}
		return nil
	})
}

// TestDeploy_StaleDeclarationRefused (DESIGN §12): a declaration older than the one applied
// — replayed with its original signature, or signed by the operator — is refused, the node
// keeps what it applied, and the refusal is audited. The node restarts between the
// declaration it applied and the stale one: what it applied is known from its store, not
// from memory (a follower that forgot it applied the older one, and re-applied the newest
// as if it were new).
func TestDeploy_StaleDeclarationRefused(t *testing.T) {
	t.Parallel() // mostly waits (redeliveries, a follower's back-off): it overlaps the others
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.ClientAddr = testbed.FreeAddr(t) // a restart keeps it
	b := newBedAt(t, cfg)
	b.ticker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b.deploy("ticker", "1")
	b.running(t, "ticker", "1", 0)
	st, err := b.js.Stream(ctx, manifest.StateStreamName)
	if err != nil {
		t.Fatal(err)
	}
	old, err := st.GetLastMsgForSubject(ctx, manifest.StateSubject("alpha"))
	if err != nil {
		t.Fatal(err)
	}
	second := b.deploy("ticker", "2")
	before := b.running(t, "ticker", "2", 0)
	b.close()
	b = newBedAt(t, cfg)
	b.running(t, "ticker", "2", before.PID)

	// Replayed as it was published (but for the stream's write check and dedup id, which no
	// signature covers; after the dedup window the id would pass too): a valid signature,
	// an older revision.
	old.Header.Del(jetstream.ExpectedLastSubjSeqHeader)
	old.Header.Del(jetstream.MsgIDHeader)
	if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: old.Subject, Header: old.Header, Data: old.Data}); err != nil {
		t.Fatal(err)
	}
	refusals := b.declarationRefusals(t)
	// STATE keeps one declaration per node: the next one published before the node read
	// this one would replace it unseen.
	if reasons := refusals(1); !strings.Contains(reasons, "stale declaration") {
		t.Fatalf("refusals %s, want the stale one", reasons)
	}
	// Forged: a newer revision, signed by the operator's key under the controller's name.
	var d deploy.Declaration
	json.Unmarshal(old.Data, &d)
	d.Revision = second.Declared[0].Revision + 100
	body, _ := json.Marshal(d)
	seed, _ := os.ReadFile(filepath.Join(b.dir, datadir.OperatorSeedFile))
	opKey, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		t.Fatal(err)
	}
	h, _ := envelope.Stamp(opKey, "alpha", "alpha", manifest.StateSubject("alpha"), body, envelope.Options{})
	if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: manifest.StateSubject("alpha"), Header: h, Data: body}); err != nil {
		t.Fatal(err)
	}
	// Signed by another server of the mesh that does not hold the controller seat: at the
	// seat's current epoch (held by alpha), and at an epoch the seat never reaches.
	beta, _ := nkeys.CreateServer()
	betaPub, _ := beta.PublicKey()
	betaX, _ := nkeys.CreateCurveKeys()
	betaXPub, _ := betaX.PublicKey()
	b.kvPut(registry.Bucket, "identity.node.beta", fmt.Sprintf(`{"public_key":%q,"xkey":%q}`, betaPub, betaXPub))
	if reasons := refusals(2); !strings.Contains(reasons, "stale declaration") || !strings.Contains(reasons, "not signed by the mesh's controller") {
		t.Fatalf("refusals %s, want one stale and one forged", reasons)
	}
	d.Controller = "beta"
	// The seat's epoch now: alpha took the seat again when it restarted.
	epoch := controllerEpoch(t, b, func(e uint64) bool { return e > 0 })
	for _, tc := range []struct {
		epoch uint64
		want  string
	}{{epoch, "of the controller seat is alpha's"}, {epoch + 50, "names controller epoch"}} {
		d.Epoch = tc.epoch
		// Published again (a new revision, a new message id) until the registry's mirror
		// knows beta as a server and the refusal names the seat's holder.
		retryUntil(t, 20*time.Second, func() error {
			before := strings.Count(refusals(0), "\n")
			d.Revision++
			body, _ := json.Marshal(d)
			h, _ := deploy.Sign(beta, "beta", d, body)
			if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: manifest.StateSubject("alpha"), Header: h, Data: body}); err != nil {
				return err
			}
			reasons := refusals(before + 1)
			if last := reasons[strings.LastIndex(strings.TrimSuffix(reasons, "\n"), "\n")+1:]; !strings.Contains(last, tc.want) {
				return fmt.Errorf("the last refusal %s, want %q", last, tc.want)
			}
			return nil
		})
	}
	// Still the newest applied: version 2 runs, nothing was stopped or started again.
	if p := b.running(t, "ticker", "2", 0); p.Revision != second.Declared[0].Revision || p.Restarts != 0 {
		t.Fatalf("after the refusals: %+v, want revision %d unchanged", p, second.Declared[0].Revision)
	}
	// Applied once: delivered again at the restart, it was recognised as the one applied.
	applied := 0
	for _, r := range b.auditAll("alpha") {
		var ev struct{ Revision uint64 }
		if r.Subject == manifest.NodeEventSubject("alpha", host.EventApplied) && json.Unmarshal(r.Body, &ev) == nil && ev.Revision == second.Declared[0].Revision {
			applied++
		}
	}
	if applied != 1 {
		t.Fatalf("revision %d applied %d times, want once: the restart forgot it was applied", second.Declared[0].Revision, applied)
	}
}

// TestDeploy_AllReachesANodeThatJoinsLater (issue 38): a server that joins after a
// deployment to every node (`deploy --all`) is declared it when its identity reaches the
// registry — not at the controller's next periodic check, a minute later (after a grow
// 1 → 3, one new node ran nothing for over 45 s). The join is its identity written to the
// registry, as a joining node does; the bound is well inside that minute.
func TestDeploy_AllReachesANodeThatJoinsLater(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.ticker()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.Deploy(ctx, b.op, api.DeployRequest{Module: "ticker", Deployment: api.Deployment{Version: "1", All: true, Instances: 1}}); err != nil {
		t.Fatalf("deploy --all: %v", err)
	}
	b.running(t, "ticker", "1", 0)
	beta, _ := nkeys.CreateServer()
	betaPub, _ := beta.PublicKey()
	betaX, _ := nkeys.CreateCurveKeys()
	betaXPub, _ := betaX.PublicKey()
	b.kvPut(registry.Bucket, "identity.node.beta", fmt.Sprintf(`{"public_key":%q,"xkey":%q}`, betaPub, betaXPub))
	st, err := b.js.Stream(ctx, manifest.StateStreamName)
	if err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 15*time.Second, func() error {
		m, err := st.GetLastMsgForSubject(ctx, manifest.StateSubject("beta"))
		if err != nil {
			return fmt.Errorf("beta's declaration: %w", err)
		}
		var d deploy.Declaration
		if err := json.Unmarshal(m.Data, &d); err != nil {
			return err
		}
		if mod, ok := d.Module("ticker"); !ok || mod.Version != "1" {
			return fmt.Errorf("beta is declared %+v, want ticker 1", d.Modules)
		}
		return nil
	})
}

// declarationRefusals returns a wait for at least want refusals of a declaration by node
// alpha in its audit log, which returns their bodies, one a line.
func (b *bed) declarationRefusals(t *testing.T) func(want int) string {
	return func(want int) string {
		var refused []api.AuditRecord
		// A declaration naming an epoch the leases' mirror has not seen waits 30 s for it
		// before it is refused (host's holderWait).
		retryUntil(t, 45*time.Second, func() error {
			b.waitAudited(5 * time.Second)
			refused = refused[:0]
			for _, r := range b.auditAll("alpha") {
				if r.Subject == manifest.NodeEventSubject("alpha", host.EventRefused) {
					refused = append(refused, r)
				}
			}
			if len(refused) < want {
				return fmt.Errorf("%d refusals audited, want %d", len(refused), want)
			}
			return nil
		})
		reasons := ""
		for _, r := range refused {
			reasons += string(r.Body) + "\n"
		}
		return reasons
	}
}

// TestDeploy_CorruptedArtifactRefused: an artifact whose content no longer hashes to its
// digest is refused and reported as failed, and nothing is started.
func TestDeploy_CorruptedArtifactRefused(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: ticker\nrequires: [mesh-bus]\n")
	b.putArtifact("ticker", "1", fmt.Sprintf(sleeper, "1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obs, err := artifact.Lookup(ctx, b.js)
	if err != nil {
		t.Fatal(err)
	}
	oi, err := obs.GetInfo(ctx, artifact.Name("ticker", "1"))
	if err != nil {
		t.Fatal(err)
	}
	// Replaced behind the store's back, its metadata (and so its recorded digest) kept.
	if _, err := obs.Put(ctx, oi.ObjectMeta, strings.NewReader("#!/bin/sh\necho pwned > /tmp/pwned\nsleep 600\n")); err != nil {
		t.Fatal(err)
	}
	b.deploy("ticker", "1")
	var ps []api.Process
	retryUntil(t, 20*time.Second, func() error {
		ps = b.ps("ticker")
		if len(ps) != 1 || ps[0].State != host.StateFailed || !strings.Contains(ps[0].Reason, "digest") {
			return fmt.Errorf("ps %+v", ps)
		}
		return nil
	})
	if ps[0].PID != 0 {
		t.Fatalf("a process runs from a corrupted artifact: %+v", ps[0])
	}
	if files, _ := filepath.Glob(filepath.Join(b.dir, "modules", "ticker", "artifact-*")); len(files) > 0 {
		t.Fatalf("the corrupted artifact was kept on disk: %v", files)
	}
}

// restartableTicker starts a node on a fixed client port (a restart keeps it) that runs
// ticker's version 1, and returns its configuration, the bed, the deploy's reply and the
// process.
func restartableTicker(t *testing.T) (config.Config, *bed, api.DeployReply, api.Process) {
	t.Helper()
	cfg := testConfig(t.TempDir(), "alpha")
	cfg.ClientAddr = testbed.FreeAddr(t)
	b := newBedAt(t, cfg)
	b.register("module: ticker\nrequires: [mesh-bus]\n")
	b.putArtifact("ticker", "1", fmt.Sprintf(sleeper, "1"))
	r := b.deploy("ticker", "1")
	return cfg, b, r, b.running(t, "ticker", "1", 0)
}

// TestDeploy_ResumesAfterRestart: a node that stops stops its modules, and starts them again
// from its last applied declaration when it starts, without being told anything new — on a
// fixed client port, from disk before its bus is open.
func TestDeploy_ResumesAfterRestart(t *testing.T) {
	t.Parallel()
	cfg, b, r, first := restartableTicker(t)
	b.close()
	if err := syscall.Kill(first.PID, 0); err == nil {
		t.Fatalf("process %d outlived its node", first.PID)
	}
	b = newBedAt(t, cfg)
	// The node says what it applied, from its store, before any report reaches a controller.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got := b.n.Status(ctx).AppliedRevision; got != r.Declared[0].Revision {
		t.Fatalf("status after the restart: applied revision %d, want %d", got, r.Declared[0].Revision)
	}
	again := b.running(t, "ticker", "1", first.PID)
	if again.Revision != r.Declared[0].Revision {
		t.Fatalf("after the restart: %+v, want revision %d", again, r.Declared[0].Revision)
	}
}

// TestDeploy_ResumesWithItsFilesIncomplete: a module whose artifact is gone from disk when
// its node starts (a kill -9 during its download, say) is prepared again once the bus is
// open; the node, which resumes its modules before its bus, used to panic on the nil bus.
func TestDeploy_ResumesWithItsFilesIncomplete(t *testing.T) {
	t.Parallel()
	cfg, b, _, first := restartableTicker(t)
	b.close()
	files, _ := filepath.Glob(filepath.Join(cfg.DataDir, "modules", "ticker", "artifact-*"))
	if len(files) != 1 {
		t.Fatalf("artifacts on disk: %v, want one", files)
	}
	if err := os.Remove(files[0]); err != nil {
		t.Fatal(err)
	}
	b = newBedAt(t, cfg)
	b.running(t, "ticker", "1", first.PID)
}

// TestDeploy_RunsFromARelativeDataDir: `meshnode up`'s data dir is relative
// (./meshnode-data); a module's process, which runs in its own directory, is still found
// and given paths that reach its files.
func TestDeploy_RunsFromARelativeDataDir(t *testing.T) {
	t.Chdir(t.TempDir())
	b := newBedAt(t, testConfig("meshnode-data", "alpha"))
	b.register("module: ticker\nrequires: [mesh-bus]\n")
	b.putArtifact("ticker", "1", fmt.Sprintf(sleeper, "1"))
	b.deploy("ticker", "1")
	b.running(t, "ticker", "1", 0)
}

// controllerEpoch waits until the controller seat is held and ok accepts its epoch.
func controllerEpoch(t *testing.T, b *bed, ok func(uint64) bool) uint64 {
	t.Helper()
	var epoch uint64
	retryUntil(t, 30*time.Second, func() error {
		list, err := askSeats(b)
		if err != nil {
			return err
		}
		for _, s := range list {
			if s.Seat == manifest.ControllerSeat && s.Holder != "" && ok(s.Epoch) {
				epoch = s.Epoch
				return nil
			}
		}
		return fmt.Errorf("seats %+v", list)
	})
	return epoch
}

// TestDeploy_GoesOnAfterStateIsMadeAgain: STATE lost and made again by the drift repair
// begins its sequences again, below the revision the host applied; the next deploy still
// reaches the host (its reported revision is the publisher's floor).
func TestDeploy_GoesOnAfterStateIsMadeAgain(t *testing.T) {
	t.Parallel() // mostly waits (redeliveries, a follower's back-off): it overlaps the others
	b := newBed(t)
	b.ticker()
	for _, v := range []string{"1", "2", "1"} { // a few revisions, so the lost ones are above 1
		b.deploy("ticker", v)
		b.running(t, "ticker", v, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.js.DeleteStream(ctx, manifest.StateStreamName); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 30*time.Second, func() error {
		_, err := b.js.Stream(ctx, manifest.StateStreamName)
		return err
	})
	b.deploy("ticker", "2")
	b.running(t, "ticker", "2", 0)
}

// TestDeploy_GoesOnAfterTheLeasesAreMadeAgain: the leases' bucket lost and made again begins
// its revisions, the controller's epochs, again; the host, which applied a declaration at a
// higher epoch, takes the next one from the seat's holder now.
func TestDeploy_GoesOnAfterTheLeasesAreMadeAgain(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A high epoch: the bucket's revisions pushed up, then the controller's lease taken
	// away, so that the seat is taken again at a revision past them.
	kv, err := b.js.KeyValue(ctx, "mesh-seats")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if _, err := kv.Put(ctx, fmt.Sprintf("filler-%d", i), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, manifest.ControllerSeat); err != nil {
		t.Fatal(err)
	}
	high := controllerEpoch(t, b, func(e uint64) bool { return e > 40 })
	b.ticker()
	b.deploy("ticker", "1")
	b.running(t, "ticker", "1", 0)

	if err := b.js.DeleteKeyValue(ctx, "mesh-seats"); err != nil {
		t.Fatal(err)
	}
	low := controllerEpoch(t, b, func(e uint64) bool { return e < high })
	t.Logf("controller epoch %d, then %d in the bucket made again", high, low)
	b.deploy("ticker", "2")
	b.running(t, "ticker", "2", 0)
}
