//go:build integration

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/sandbox"
)

// isolationBed is a node started as an operator would, in one of two modes: as root (each
// module its own uid), or as an unprivileged user in a cgroup v2 delegated to it (Landlock
// alone, as under systemd's User= with Delegate=yes).
type isolationBed struct {
	dir    string
	args   []string
	p      *process
	uid    int
	deleg  *os.File // the delegated cgroup, unprivileged
	binary string
}

func newIsolationBed(t *testing.T, unprivileged bool) *isolationBed {
	t.Helper()
	if os.Geteuid() != 0 {
		testbed.Skip(t, "the isolation beds start nodes as root and as another user")
	}
	base := t.TempDir()
	testbed.Traversable(t, base)
	b := &isolationBed{dir: filepath.Join(base, "data"), binary: binary}
	b.args = append([]string{"--data-dir", b.dir, "--name", "alpha"}, loopback...)
	if unprivileged {
		b.uid = testbed.Nobody
		// The binary, where the user can run it.
		bin := filepath.Join(base, "meshnode")
		data, err := os.ReadFile(binary)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		b.binary = bin
		if err := os.Mkdir(b.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chown(b.dir, testbed.Nobody, testbed.Nobody)
		b.deleg = testbed.DelegatedCgroup(t)
	}
	b.start(t)
	return b
}

// start starts (or starts again) the bed's node.
func (b *isolationBed) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(b.binary, append([]string{"up"}, b.args...)...)
	cmd.Env = cleanEnv()
	if b.uid != 0 {
		cmd.Env = append(cmd.Env, "HOME="+filepath.Dir(b.dir))
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential:  &syscall.Credential{Uid: uint32(b.uid), Gid: uint32(b.uid)},
			UseCgroupFD: true, CgroupFD: int(b.deleg.Fd()),
		}
	}
	b.p = launchCmd(t, cmd, "up")
	b.p.awaitReady(t, 30*time.Second)
}

// op runs a client verb against the bed's node as the operator.
func (b *isolationBed) op(t *testing.T, args ...string) result {
	t.Helper()
	return meshnode(t, nil, append(args, "--data-dir", b.dir)...)
}

// deploy registers module, stores script as its artifact, and deploys it, waiting until it
// runs.
func (b *isolationBed) deploy(t *testing.T, module, script string) {
	b.deployWith(t, module, script, "--wait", "60s")
}

// deployWith is deploy with more flags for the deploy verb.
func (b *isolationBed) deployWith(t *testing.T, module, script string, flags ...string) {
	t.Helper()
	art := filepath.Join(t.TempDir(), module+".sh")
	os.WriteFile(art, []byte(script), 0o755)
	b.deployFile(t, "module: "+module+"\nrequires: [mesh-bus]\n", art, flags...)
}

// deployFile registers the module of manifest and deploys the file art as its artifact.
func (b *isolationBed) deployFile(t *testing.T, manifestText, art string, flags ...string) {
	t.Helper()
	module := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(manifestText, "\n", 2)[0], "module:"))
	manifest := filepath.Join(t.TempDir(), module+".yaml")
	os.WriteFile(manifest, []byte(manifestText), 0o600)
	for _, args := range [][]string{
		{"module", "register", manifest, "--creds-out", manifest + ".nk"},
		{"artifact", "put", module, art, "--version", "1"},
		append([]string{"deploy", module, "--version", "1", "--all"}, flags...),
	} {
		if r := b.op(t, args...); r.code != 0 {
			t.Fatalf("%s %s: exit %d\n%s%s\n%s", args[0], module, r.code, r.stdout, r.stderr, b.p.stderr)
		}
	}
}

// logs is what module printed so far.
func (b *isolationBed) logs(t *testing.T, module string) string {
	t.Helper()
	return b.op(t, "logs", module).stdout
}

// ps is the bed's processes by module.
func (b *isolationBed) ps(t *testing.T) map[string]psRow {
	t.Helper()
	r := b.op(t, "ps", "--json")
	rows := map[string]psRow{}
	for line := range strings.Lines(r.stdout) {
		var p psRow
		if json.Unmarshal([]byte(line), &p) == nil {
			rows[p.Module] = p
		}
	}
	return rows
}

type psRow struct {
	Module, State, Reason string
	PID                   int
	Restarts              int
	Isolation             *api.Isolation
}

// attacker tries every way the attacker read the node's secrets, and prints GOT
// for each that worked and DENIED for each that did not; OWN for its own seed (which it
// must read). D is the node's data dir.
const attacker = `#!/bin/sh
D=%q
try() { out=$(sh -c "$1" 2>/dev/null); if [ -n "$out" ]; then echo "GOT $2: $(echo "$out" | head -c 80)"; else echo "DENIED $2"; fi; }
try 'cat "$MESH_CREDS"' OWN-creds
try 'cat ../../../operator.nk' relative-operator
try "cat $D/operator.nk" absolute-operator
try "head -c 64 $D/meshnode.db" store
try "cat $D/node.json" node-json
try "cat $D/modules/victim/creds.nk" victim-creds
try "cat $D/modules/victim/secrets/* $D/modules/victim/work/*" victim-files
try "cat /proc/$PPID/root$D/operator.nk" proc-root
try "ls /proc/$PPID/cwd/" proc-cwd
try "tr '\0' '\n' < /proc/$PPID/environ" proc-environ
try "find / -name '*.nk' 2>/dev/null | grep -v '^'\"$MESH_CREDS\"'$'" find-seeds
try "kill -0 $PPID && echo signalled" signal-node
V=$(grep -l victim-marker /proc/[0-9]*/cmdline 2>/dev/null | head -1 | cut -d/ -f3)
try "kill -0 $V && echo signalled $V" signal-victim
echo "victim pid ${V:-none}"
echo ATTACK-DONE
exec sleep 600
`

// victim is a module whose secrets the attacker goes for.
const victim = "#!/bin/sh\necho victim-secret > work-file\nexec sh -c 'exec sleep 600' victim-marker\n"

func testIsolationAttack(t *testing.T, unprivileged bool) {
	b := newIsolationBed(t, unprivileged)
	b.deploy(t, "victim", victim)
	b.deploy(t, "attacker", fmt.Sprintf(attacker, b.dir))
	var out string
	retryUntil(t, 30*time.Second, func() error {
		if out = b.logs(t, "attacker"); !strings.Contains(out, "ATTACK-DONE") {
			return fmt.Errorf("the attacker has not finished: %q", out)
		}
		return nil
	})
	if !strings.Contains(out, "GOT OWN-creds: SU") {
		t.Fatalf("the module cannot read its own seed:\n%s", out)
	}
	if strings.Contains(out, "victim pid none") {
		t.Fatalf("the attacker did not find the victim to signal:\n%s", out)
	}
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "GOT ") && !strings.HasPrefix(line, "GOT OWN-") {
			t.Errorf("the attacker got through: %s", line)
		}
	}
	// What ps says the attacker got, read back from the kernel.
	iso := b.ps(t)["attacker"].Isolation
	if iso == nil || !iso.NoNewPrivs || iso.Landlock == "none" || iso.Cgroup == "" || iso.CapEff != "0000000000000000" {
		t.Fatalf("ps isolation %+v, want no_new_privs, Landlock, a cgroup and no capabilities", iso)
	}
	if !unprivileged && !strings.HasPrefix(iso.User, "uid ") {
		t.Fatalf("ps isolation user %q, want a uid of its own", iso.User)
	}
	t.Logf("attacker's isolation: %+v\n%s", *iso, out)
}

func TestIntegration_IsolationAttackAsRoot(t *testing.T)        { testIsolationAttack(t, false) }
func TestIntegration_IsolationAttackUnprivileged(t *testing.T)  { testIsolationAttack(t, true) }
func TestIntegration_IsolationEscapesAsRoot(t *testing.T)       { testIsolationEscapes(t, false) }
func TestIntegration_IsolationEscapesUnprivileged(t *testing.T) { testIsolationEscapes(t, true) }

// escaper leaves processes behind by every way a process leaves its group: setsid, a
// double fork. Each sleep's fraction is this test binary's pid: escaped finds this run's.
var escaper = strings.ReplaceAll("#!/bin/sh\nsetsid sh -c 'exec sleep 4242.P' &\n(sh -c 'sleep 4243.P &')\nexec sleep 4244.P\n", "P", strconv.Itoa(os.Getpid()))

// escaped are the escaper's processes that run.
func escaped() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.HasPrefix(b, []byte("sleep\x00424")) && bytes.HasSuffix(b, []byte("."+strconv.Itoa(os.Getpid())+"\x00")) {
			pid, _ := strconv.Atoi(e.Name())
			pids = append(pids, pid)
		}
	}
	return pids
}

// testIsolationEscapes: nothing a module started outlives its undeploy, or a kill -9 of its
// node and the restart; copies never pile up.
func testIsolationEscapes(t *testing.T, unprivileged bool) {
	b := newIsolationBed(t, unprivileged)
	if n := len(escaped()); n != 0 {
		t.Fatalf("%d escaped sleeps run before the bed", n)
	}
	b.deploy(t, "escaper", escaper)
	retryUntil(t, 10*time.Second, func() error {
		if n := len(escaped()); n != 3 {
			return fmt.Errorf("%d of 3 processes run", n)
		}
		return nil
	})
	if r := b.op(t, "undeploy", "escaper"); r.code != 0 {
		t.Fatalf("undeploy: exit %d %s", r.code, r.stderr)
	}
	retryUntil(t, 15*time.Second, func() error {
		if pids := escaped(); len(pids) != 0 {
			return fmt.Errorf("after undeploy, still running: %v", pids)
		}
		return nil
	})
	// Deployed again, then the node is killed and started again: what ran before is ended,
	// and exactly one copy runs after.
	b.deploy(t, "escaper", escaper)
	var before []int
	retryUntil(t, 10*time.Second, func() error {
		if before = escaped(); len(before) != 3 {
			return fmt.Errorf("%d of 3 processes run", len(before))
		}
		return nil
	})
	b.p.stop(t, syscall.SIGKILL)
	b.start(t)
	retryUntil(t, 30*time.Second, func() error {
		now := escaped()
		for _, pid := range before {
			for _, p := range now {
				if p == pid {
					return fmt.Errorf("process %d of the killed node's run still runs (now: %v)", pid, now)
				}
			}
		}
		if len(now) != 3 {
			return fmt.Errorf("%d processes run after the restart, want the new run's 3: %v", len(now), now)
		}
		return nil
	})
}

func TestIntegration_IsolationForkBombAsRoot(t *testing.T)       { testIsolationForkBomb(t, false) }
func TestIntegration_IsolationForkBombUnprivileged(t *testing.T) { testIsolationForkBomb(t, true) }

// testIsolationForkBomb: a fork bomb is held at its limit (pids.max; without a pids
// controller, as an unprivileged node on this machine has none, its uid's RLIMIT_NPROC),
// ended and reported as too many processes, and the node and another module keep working.
// Its sleeps stay, so the bomb stays at its limit rather than dying out when refused.
func testIsolationForkBomb(t *testing.T, unprivileged bool) {
	b := newIsolationBed(t, unprivileged)
	b.deploy(t, "victim", victim)
	b.deployWith(t, "bomber", "#!/bin/sh\nfor i in $(seq 2000); do sleep 1000 & done\nb() { b | b & }\nb\nexec sleep 600\n")
	retryUntil(t, 60*time.Second, func() error {
		p := b.ps(t)["bomber"]
		if !strings.Contains(p.Reason, sandbox.CauseForks) {
			return fmt.Errorf("bomber: %+v", p)
		}
		return nil
	})
	v := b.ps(t)["victim"]
	if v.State != "running" || v.Restarts != 0 {
		t.Fatalf("the other module after the bomb: %+v", v)
	}
	if r := b.op(t, "status"); r.code != 0 {
		t.Fatalf("the node after the bomb: exit %d %s", r.code, r.stderr)
	}
	if r := b.op(t, "undeploy", "bomber"); r.code != 0 {
		t.Fatalf("undeploy: exit %d %s", r.code, r.stderr)
	}
}

// TestIntegration_NodeExampleSandboxed: the Node.js example, bundled into one file by its
// own `npm run bundle`, stored with artifact put and deployed, runs under the sandbox with
// no read path beyond a module's own — V8's JIT included — and does its work: it consumes
// a Go module's event and emits its note, which a Go reader's sdk checks.
func TestIntegration_NodeExampleSandboxed(t *testing.T) {
	exampleDir := nodeExample(t)
	bundle := exec.Command("npm", "run", "bundle")
	bundle.Dir = exampleDir
	if out, err := bundle.CombinedOutput(); err != nil {
		t.Fatalf("npm run bundle: %v\n%s", err, out)
	}
	b := newIsolationBed(t, false)
	shopSeed := registerModule(t, b.dir, "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	readerSeed := registerModule(t, b.dir, "module: reader\nrequires: [mesh-bus]\nconsumes: [notes.note.written]\n")
	b.deployFile(t, "module: notes\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\nemits: [note.written]\ntools: [status]\n",
		filepath.Join(exampleDir, "dist", "module.js"), "--wait", "60s")
	retryUntil(t, 30*time.Second, func() error {
		if out := b.logs(t, "notes"); !strings.Contains(out, " ready notes") {
			return fmt.Errorf("notes has not said it is ready: %q", out)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got, shop := notesPair(ctx, t, b.p.clientURL, readerSeed, shopSeed)
	id, err := shop.Emit(ctx, "order.placed", map[string]any{"order": 1})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-got:
		if e.Source != "notes" || e.Causation != id {
			t.Fatalf("the note: source %q, causation %q; want notes, %s", e.Source, e.Causation, id)
		}
	case <-ctx.Done():
		t.Fatalf("no note from the sandboxed Node.js module:\n%s", b.logs(t, "notes"))
	}
	iso := b.ps(t)["notes"].Isolation
	if iso == nil || !strings.HasPrefix(iso.User, "uid ") || iso.Landlock == "none" || iso.Cgroup == "" {
		t.Fatalf("notes' isolation: %+v", iso)
	}
}
