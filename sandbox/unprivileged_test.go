package sandbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// nobody is the unprivileged user the beds run a node as.
const nobody = 65534

// TestSandbox_Unprivileged runs this package's beds again in a process that is not root,
// as a node started by an operator's own user (or under systemd's User= with Delegate=yes)
// runs: Landlock alone, in a v2 cgroup delegated to it (made here as root, then chowned).
func TestSandbox_Unprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		testbed.Skip(t, "the bed starts a process as another user: run the tests as root")
	}
	v2 := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(v2, "cgroup.procs")); err != nil {
		if v2 = "/sys/fs/cgroup"; !fileExists(filepath.Join(v2, "cgroup.kill")) {
			testbed.Skip(t, "no cgroup v2 hierarchy to delegate")
		}
	}
	deleg := filepath.Join(v2, "meshnode-bed-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(deleg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(deleg) })
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
		if err := os.Chown(filepath.Join(deleg, f), nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	// The test binary and a temporary directory the user can reach.
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o711)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "sandbox.test")
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	os.Mkdir(tmp, 0o700)
	os.Chown(tmp, nobody, nobody)
	fd, err := os.Open(deleg)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	cmd := exec.Command(bin, "-test.count=1", "-test.v", "-test.run", "^TestSandbox_(FilesystemIsItsOwn|CannotSignalTheNode|NothingOutlivesIt|DiskShareIsBounded|IsolationIsReadBack|AMissingProgramIsErrExec)$")
	cmd.Dir = tmp
	cmd.Env = []string{"PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "HOME=" + tmp, testbed.MustRunEnv + "=" + testbed.MustRun}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: nobody, Gid: nobody},
		UseCgroupFD: true, CgroupFD: int(fd.Fd()),
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the beds as uid %d: %v\n%s", nobody, err, out)
	}
	t.Logf("the beds as uid %d:\n%s", nobody, out)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
