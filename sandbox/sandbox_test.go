package sandbox_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/sandbox"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	sandbox.Launcher() // the sandbox starts this test binary as its launcher
	goleak.VerifyTestMain(m)
}

// bed is one sandbox, with a module-like directory: work (its own, read-write), a secret it
// may read, and a secret of the node's beside them that it must not.
type bed struct {
	sb                    *sandbox.Sandbox
	dir, work, mine, node string
	user                  *sandbox.User
}

func newBed(t *testing.T) *bed {
	t.Helper()
	dir := t.TempDir()
	testbed.Traversable(t, dir) // a module user must reach its directory, never list the node's
	b := &bed{dir: dir, work: filepath.Join(dir, "work"), mine: filepath.Join(dir, "mine.nk"), node: filepath.Join(dir, "operator.nk")}
	os.Mkdir(b.work, 0o700)
	os.WriteFile(b.mine, []byte("SUMINE"), 0o400)
	os.WriteFile(b.node, []byte("SUOPERATOR"), 0o600)
	users, u := moduleUser(t, dir, b.work, b.mine)
	sb, err := sandbox.Open(sandbox.Config{Name: sandbox.SubtreeName("test", dir), Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	if err := sb.Check(); err != nil {
		testbed.Skip(t, "full isolation cannot be had here: %v", err)
	}
	b.sb, b.user = sb, u
	return b
}

// moduleUser is, when the test runs as root, the module users of a node whose data dir is
// dir, and the bed's module's user, who is given owns; nil, nil otherwise.
func moduleUser(t *testing.T, dir string, owns ...string) (*sandbox.Users, *sandbox.User) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, nil
	}
	users, err := sandbox.OpenUsers(filepath.Join(dir, "users.json"), sandbox.DefaultFirstUID, sandbox.DefaultLastUID)
	if err != nil {
		t.Fatal(err)
	}
	u, err := users.For("m")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range owns {
		os.Chown(p, u.UID, u.GID)
	}
	return users, u
}

// run starts script under sh in the sandbox, as the bed's module.
func (b *bed) start(t *testing.T, name, script string, lim api.Limits) (*sandbox.Process, *testbed.SyncBuffer) {
	t.Helper()
	out := &testbed.SyncBuffer{}
	p, err := b.sb.Start(sandbox.Proc{
		Name: name, Path: "/bin/sh", Args: []string{"-c", script},
		Env: []string{"PATH=/usr/bin:/bin", "NODE_PID=" + strconv.Itoa(os.Getpid()), "MINE=" + b.mine, "NODE_SECRET=" + b.node, "HOME=" + b.work},
		Dir: b.work, Read: []string{b.mine}, Write: []string{b.work}, User: b.user, Limits: lim, DiskDir: b.work,
		Stdout: out, Stderr: out, WaitDelay: time.Second,
	})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return p, out
}

func (b *bed) run(t *testing.T, script string) string {
	t.Helper()
	p, out := b.start(t, "run", script, api.Limits{})
	p.Wait()
	return out.String()
}

func TestSandbox_FilesystemIsItsOwn(t *testing.T) {
	b := newBed(t)
	out := b.run(t, `
cat "$MINE" && echo " read-mine"
cat "$NODE_SECRET" 2>/dev/null && echo "read-node-secret"
cat /proc/$NODE_PID/environ 2>/dev/null | tr '\0' '\n' | head -1 | grep . && echo "read-node-environ"
ls /proc/$NODE_PID/cwd/ 2>/dev/null && echo "listed-node-cwd"
ls /proc/$NODE_PID/root/tmp 2>/dev/null && echo "listed-node-root"
find / -name '*.nk' 2>/dev/null | grep -v "^$MINE$"
echo written > ./file && cat ./file
mkdir -p tmp data && echo r > tmp/x && mv tmp/x data/x && ln data/x data/y && echo moved-within
echo x > /tmp/escape 2>/dev/null && echo "wrote-tmp"
echo x > "$(dirname "$MINE")/planted" 2>/dev/null && echo "wrote-beside"
echo done`)
	for _, bad := range []string{"SUOPERATOR", "read-node-secret", "read-node-environ", "listed-node-cwd", "listed-node-root", "operator.nk", "wrote-tmp", "wrote-beside"} {
		if strings.Contains(out, bad) {
			t.Errorf("the sandboxed process got to %q:\n%s", bad, out)
		}
	}
	for _, good := range []string{"SUMINE read-mine", "written", "moved-within", "done"} {
		if !strings.Contains(out, good) {
			t.Errorf("the sandboxed process could not do %q:\n%s", good, out)
		}
	}
}

func TestSandbox_CannotSignalTheNode(t *testing.T) {
	b := newBed(t)
	out := b.run(t, `kill -0 $NODE_PID 2>/dev/null && echo signalled || echo refused`)
	if !strings.Contains(out, "refused") {
		t.Fatalf("the sandboxed process could signal the node: %s", out)
	}
}

// TestSandbox_NothingOutlivesIt: processes that left the process's group and session
// (setsid, a double fork) end with it.
func TestSandbox_NothingOutlivesIt(t *testing.T) {
	b := newBed(t)
	p, _ := b.start(t, "escaper", escaper("4242", "4243", "4244"), api.Limits{})
	testbed.RetryUntil(t, 5*time.Second, func() error {
		if n := len(sleepers()); n < 3 {
			return fmt.Errorf("%d of 3 sleeps started", n)
		}
		return nil
	})
	exited := make(chan error, 1)
	go func() { exited <- p.Wait() }()
	p.Signal(syscall.SIGKILL)
	<-exited
	testbed.RetryUntil(t, 5*time.Second, func() error {
		if s := sleepers(); len(s) > 0 {
			return fmt.Errorf("left running: %v", s)
		}
		return nil
	})
}

// escaper is a script that leaves sleeps of the given seconds behind by every way a process
// leaves its group (setsid, a double fork) and sleeps itself; each sleep's fraction is this
// test binary's pid, so sleepers finds this run's alone.
func escaper(a, b, c string) string {
	f := "." + strconv.Itoa(os.Getpid())
	return fmt.Sprintf(`setsid sh -c 'exec sleep %s' & (sh -c 'sleep %s &') ; sleep %s`, a+f, b+f, c+f)
}

// sleepers are this test binary's escaped processes still running.
func sleepers() []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.HasPrefix(b, []byte("sleep\x00424")) && bytes.HasSuffix(b, []byte("."+strconv.Itoa(os.Getpid())+"\x00")) {
			found = append(found, e.Name()+":"+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return found
}

func TestSandbox_ForkBombIsEnded(t *testing.T) {
	b := newBed(t)
	// Sleeps that stay, then the classic bomb: it reaches its limit and is held there.
	p, _ := b.start(t, "bomb", `for i in $(seq 200); do sleep 1000 & done; b() { b | b & }; b; sleep 100`, api.Limits{Processes: 64})
	endedFor(t, p, sandbox.CauseForks, "fork bomb")
}

func TestSandbox_OutOfMemoryIsReported(t *testing.T) {
	b := newBed(t)
	p, _ := b.start(t, "hog", `x=a; while :; do x="$x$x"; done`, api.Limits{Memory: 32 << 20})
	endedFor(t, p, sandbox.CauseOOM, "memory hog")
}

// TestSandbox_OneFileCannotOutgrowTheShare: the kernel refuses a write that takes one file
// past the disk share, at once (RLIMIT_FSIZE), and the process is reported for it.
func TestSandbox_OneFileCannotOutgrowTheShare(t *testing.T) {
	b := newBed(t)
	p, _ := b.start(t, "grower", `exec dd if=/dev/zero of=big bs=1M count=64 2>/dev/null`, api.Limits{Disk: 4 << 20})
	p.Wait()
	if got, want := p.Cause(), sandbox.CauseDisk; got != want {
		t.Fatalf("Cause()=%q, want %q", got, want)
	}
	if st, err := os.Stat(filepath.Join(b.work, "big")); err != nil || st.Size() > 4<<20 {
		t.Fatalf("the file: %v %v, want at most 4MiB", st, err)
	}
}

func TestSandbox_DiskShareIsBounded(t *testing.T) {
	b := newBed(t)
	p, _ := b.start(t, "filler", `while :; do head -c 1048576 /dev/zero >> ./fill; done`, api.Limits{Disk: 8 << 20})
	endedFor(t, p, sandbox.CauseDisk, "disk filler")
}

// endedFor waits until the sandbox ended p, within 30 s, and checks why.
func endedFor(t *testing.T, p *sandbox.Process, cause, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { p.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		p.Kill()
		t.Fatalf("the %s was not ended", what)
	}
	if got := p.Cause(); got != cause {
		t.Fatalf("Cause()=%q, want %q", got, cause)
	}
}

// TestSandbox_DeletedFilesCountToo: files a module removed while it keeps them open still
// take their space, and count toward its share.
func TestSandbox_DeletedFilesCountToo(t *testing.T) {
	b := newBed(t)
	p, _ := b.start(t, "hider", `i=0; while :; do i=$((i+1)); exec 3>hidden$i; head -c 1048576 /dev/zero >&3; rm hidden$i; sleep 1000 3>&3 & exec 3>&-; done`, api.Limits{Disk: 6 << 20})
	endedFor(t, p, sandbox.CauseDisk, "process hiding its files")
}

// TestSandbox_IsolationIsReadBack: what ps shows comes from the kernel.
func TestSandbox_IsolationIsReadBack(t *testing.T) {
	b := newBed(t)
	p, _ := b.start(t, "idle", `sleep 30`, api.Limits{Processes: 64, Memory: 64 << 20})
	defer func() { p.Kill(); p.Wait() }()
	iso, ok := p.Isolation()
	if !ok {
		t.Fatal("Isolation() of a running process: not running")
	}
	if !iso.NoNewPrivs || !strings.HasPrefix(iso.Landlock, "abi ") || iso.Cgroup == "" {
		t.Fatalf("Isolation()=%+v, want no_new_privs, a Landlock ABI and a cgroup", iso)
	}
	if b.user != nil {
		if got, want := iso.User, fmt.Sprintf("uid %d", b.user.UID); got != want {
			t.Errorf("User=%q, want %q", got, want)
		}
		if got, want := iso.CapEff, "0000000000000000"; got != want {
			t.Errorf("CapEff=%q, want %q", got, want)
		}
	}
	// As root this machine's v1 controllers hold the limits; unprivileged, nothing does.
	if got, want := len(iso.Unenforced) == 0, os.Geteuid() == 0; got != want {
		t.Errorf("Unenforced=%v as uid %d", iso.Unenforced, os.Geteuid())
	}
	if got, want := len(b.sb.Unenforceable()) == 0, os.Geteuid() == 0; got != want {
		t.Errorf("Unenforceable()=%v as uid %d", b.sb.Unenforceable(), os.Geteuid())
	}
	// Its v1 cgroups lie beneath the node's own: the node's service limits hold it too.
	if mine, its := v1Path("self", "memory"), v1Path(strconv.Itoa(p.Pid), "memory"); mine != "" && os.Geteuid() == 0 && !strings.HasPrefix(its, strings.TrimSuffix(mine, "/")+"/") {
		t.Errorf("its memory cgroup %q is not beneath the node's %q", its, mine)
	}
	cg, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.Pid), "cgroup"))
	if !strings.Contains(string(cg), iso.Cgroup) {
		t.Errorf("cgroup %q is not the process's:\n%s", iso.Cgroup, cg)
	}
}

func TestSandbox_AMissingProgramIsErrExec(t *testing.T) {
	b := newBed(t)
	_, err := b.sb.Start(sandbox.Proc{Name: "missing", Path: filepath.Join(b.dir, "nothing"), Dir: b.work, User: b.user, Stdout: os.Stderr, Stderr: os.Stderr})
	if !errors.Is(err, sandbox.ErrExec) {
		t.Fatalf("Start of a missing program: %v, want ErrExec", err)
	}
}

// TestSandbox_WithoutACgroup: where the node has no cgroup it may write, full isolation is
// refused, and `isolation: reduced` runs the process with the node as its subreaper, which
// still ends what escaped its group.
func TestSandbox_WithoutACgroup(t *testing.T) {
	dir := t.TempDir()
	testbed.Traversable(t, dir)
	users, u := moduleUser(t, dir, dir)
	cfg := sandbox.Config{Name: "nocg", Cgroup: filepath.Join(dir, "not-a-cgroup"), Users: users}
	sb, err := sandbox.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = sb.Check()
	sb.Close()
	if !errors.Is(err, sandbox.ErrReduced) || !strings.Contains(err.Error(), "isolation: reduced") {
		t.Fatalf("Check() without a cgroup: %v, want ErrReduced naming `isolation: reduced`", err)
	}
	cfg.Isolation = sandbox.Reduced
	if sb, err = sandbox.Open(cfg); err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	b := &bed{sb: sb, dir: dir, work: dir, user: u}
	p, _ := b.start(t, "escaper", escaper("4245", "4246", "4247"), api.Limits{})
	testbed.RetryUntil(t, 5*time.Second, func() error {
		if n := len(sleepers()); n < 3 {
			return fmt.Errorf("%d of 3 sleeps started", n)
		}
		return nil
	})
	if iso, _ := p.Isolation(); !iso.Subreaper || iso.Cgroup != "" || len(iso.Reduced) == 0 {
		t.Errorf("Isolation()=%+v, want the subreaper, no cgroup, and what is reduced", iso)
	}
	p.Kill()
	p.Wait()
	testbed.RetryUntil(t, 5*time.Second, func() error {
		if s := sleepers(); len(s) > 0 {
			return fmt.Errorf("left running: %v", s)
		}
		return nil
	})
	// A start that fails (the artifact is gone) returns, and the next start still works.
	if _, err := sb.Start(sandbox.Proc{Name: "missing", Path: filepath.Join(dir, "nothing"), Dir: dir, User: u, Stdout: io.Discard, Stderr: io.Discard}); !errors.Is(err, sandbox.ErrExec) {
		t.Fatalf("a missing program without a cgroup: %v, want ErrExec", err)
	}
	p, _ = b.start(t, "again", "exit 0", api.Limits{})
	p.Wait()
}

// TestSandbox_RootRunsNothingAsRoot: a root node runs a module or build only as a user of
// its own — never as root, whose files Landlock does not stop it chmod-ing and whose sockets
// it does not stop it reaching — and says why it will not; and the user it runs as has no
// capability left, its bounding set included.
func TestSandbox_RootRunsNothingAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		testbed.Skip(t, "a root node's case: run the tests as root")
	}
	b := newBed(t)
	_, err := b.sb.Start(sandbox.Proc{Name: "as-root", Path: "/bin/true", Dir: b.work, Stdout: io.Discard, Stderr: io.Discard})
	if err == nil || !strings.Contains(err.Error(), "user of its own") {
		t.Fatalf("a start as root: %v, want it refused", err)
	}
	out := b.run(t, `grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status`)
	if strings.Count(out, "0000000000000000") != 5 {
		t.Fatalf("capabilities left:\n%s", out)
	}
}

// v1Path is a process's cgroup in controller's v1 hierarchy ("" without one).
func v1Path(pid, controller string) string {
	b, _ := os.ReadFile(filepath.Join("/proc", pid, "cgroup"))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == controller {
			return f[2]
		}
	}
	return ""
}
