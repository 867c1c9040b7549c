package host_test

import (
	"os"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Launcher() // the supervisor starts this test binary as its launcher
	os.Exit(m.Run())
}

// openSandbox opens a sandbox for a supervisor whose modules live in dir, as a node would.
func openSandbox(t *testing.T, dir string) (*sandbox.Sandbox, *sandbox.Users) {
	t.Helper()
	testbed.Traversable(t, dir)
	return testbed.Sandbox(t, "alpha", dir)
}
