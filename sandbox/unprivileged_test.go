package sandbox_test

import (
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestSandbox_Unprivileged runs this package's beds again in a process that is not root,
// as a node started by an operator's own user (or under systemd's User= with Delegate=yes)
// runs: Landlock alone, in a v2 cgroup delegated to it.
func TestSandbox_Unprivileged(t *testing.T) {
	testbed.RunTestsAsNobody(t, "^TestSandbox_(FilesystemIsItsOwn|CannotSignalTheNode|NothingOutlivesIt|ForkBombIsEnded|OneFileCannotOutgrowTheShare|DiskShareIsBounded|DeletedFilesCountToo|IsolationIsReadBack|AMissingProgramIsErrExec)$")
}
