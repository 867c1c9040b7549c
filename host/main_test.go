package host_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Launcher() // the supervisor starts this test binary as its launcher
	os.Exit(m.Run())
}

// openSandbox opens a sandbox for a supervisor whose modules live in dir, as a node would:
// module users when the test runs as root, a cgroup of its own.
func openSandbox(t *testing.T, dir string) (*sandbox.Sandbox, *sandbox.Users) {
	t.Helper()
	testbed.Traversable(t, dir)
	var users *sandbox.Users
	if os.Geteuid() == 0 {
		var err error
		if users, err = sandbox.OpenUsers(filepath.Join(dir, "users.json"), sandbox.DefaultFirstUID, sandbox.DefaultLastUID); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := sandbox.Open(sandbox.Config{Name: sandbox.SubtreeName("alpha", dir), Users: users})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Check(); err != nil {
		testbed.Skip(t, "%v", err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb, users
}
