package node_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/meshnode/meshnode/sdk"
)

// crashingHolderEnv, when set, makes the test binary a module process (see crashingHolder):
// its value is "URL SEED LOG".
const crashingHolderEnv = "MESHNODE_TEST_CRASHING_HOLDER"

// crashingHolder is a module process that is a candidate for seat jobs and dies on the
// first job it gets, by kill -9 of itself after writing the job's id and delivery to LOG:
// nothing of it runs after the job, not even a deferred close.
func crashingHolder() {
	args := strings.Fields(os.Getenv(crashingHolderEnv))
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "crashing holder: want URL SEED LOG")
		os.Exit(2)
	}
	ctx := context.Background()
	c, err := sdk.Connect(ctx, args[0], args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashing holder:", err)
		os.Exit(1)
	}
	err = c.Accept("run", func(_ context.Context, j sdk.Job) error {
		f, err := os.OpenFile(args[2], os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintf(f, "%s %d\n", j.ID, os.Getpid())
			f.Sync()
			f.Close()
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashing holder:", err)
		os.Exit(1)
	}
	select {}
}
