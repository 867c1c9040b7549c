package testbed

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/sandbox"
)

// Nobody is the unprivileged user beds run a node, or a test binary, as.
const Nobody = 65534

// DelegatedCgroup makes a cgroup v2 that Nobody may manage (made as root, then chowned, as
// systemd's Delegate=yes does) and returns it opened, for a process started in it with
// SysProcAttr.UseCgroupFD. It is removed when the test ends.
func DelegatedCgroup(t testing.TB) *os.File {
	t.Helper()
	v2 := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(v2, "cgroup.procs")); err != nil {
		v2 = "/sys/fs/cgroup"
	}
	dir := filepath.Join(v2, "meshnode-bed-"+strconv.Itoa(os.Getpid())+"-"+strconv.Itoa(int(cgroupSeq.Add(1))))
	if err := os.Mkdir(dir, 0o755); err != nil {
		Skip(t, "no cgroup v2 to delegate: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
		if err := os.Chown(filepath.Join(dir, f), Nobody, Nobody); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fd.Close() })
	return fd
}

// RunTestsAsNobody runs this test binary's tests matching pattern again as Nobody, in a
// cgroup delegated to it, where every bed must run, and fails t with their output if any
// fails: a package's beds, as an unprivileged node meets them.
func RunTestsAsNobody(t *testing.T, pattern string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "the bed starts a process as another user: run the tests as root")
	}
	deleg := DelegatedCgroup(t)
	dir := t.TempDir()
	Traversable(t, dir)
	os.Chmod(dir, 0o755)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, filepath.Base(exe))
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	os.Mkdir(tmp, 0o700)
	os.Chown(tmp, Nobody, Nobody)
	cmd := exec.Command(bin, "-test.count=1", "-test.v", "-test.run", pattern)
	cmd.Dir = tmp
	cmd.Env = []string{"PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "HOME=" + tmp, MustRunEnv + "=" + MustRun}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: Nobody, Gid: Nobody},
		UseCgroupFD: true, CgroupFD: int(deleg.Fd()),
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the beds as uid %d: %v\n%s", Nobody, err, out)
	}
	t.Logf("the beds as uid %d:\n%s", Nobody, out)
}

// cgroupSeq tells apart the cgroups one test binary delegates.
var cgroupSeq atomic.Int64

// Sandbox opens a sandbox as a node whose data dir is dir opens one: module users (recorded
// in dir) when the test runs as root, its own cgroup subtree. A machine that cannot give
// full isolation skips the bed (fails it in CI).
func Sandbox(t testing.TB, node, dir string) (*sandbox.Sandbox, *sandbox.Users) {
	t.Helper()
	var users *sandbox.Users
	if os.Geteuid() == 0 {
		var err error
		if users, err = sandbox.OpenUsers(filepath.Join(dir, "users.json"), sandbox.DefaultFirstUID, sandbox.DefaultLastUID); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := sandbox.Open(sandbox.Config{Name: sandbox.SubtreeName(node, dir), Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	if err := sb.Check(); err != nil {
		Skip(t, "%v", err)
	}
	return sb, users
}

// EndNodeCgroups ends every process left in the cgroups of the node whose data dir is
// dataDir, and removes them: a bed that kills a node with SIGKILL and never starts it again
// leaves its modules running, by design, for the node's next start to end.
func EndNodeCgroups(dataDir string) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return
	}
	suffix := strings.TrimPrefix(sandbox.SubtreeName("", abs), "meshnode-")
	for _, root := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if name := d.Name(); strings.HasPrefix(name, "meshnode-") && strings.HasSuffix(name, suffix) {
				endTree(path)
				return filepath.SkipDir
			}
			return nil
		})
	}
}

// endTree kills what a cgroup holds and removes it and its children, deepest first.
func endTree(dir string) {
	var dirs []string
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		os.WriteFile(filepath.Join(dirs[i], "cgroup.kill"), []byte("1"), 0)
		for deadline := time.Now().Add(5 * time.Second); os.Remove(dirs[i]) != nil && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond) // the killed leave it once reaped
		}
	}
}
