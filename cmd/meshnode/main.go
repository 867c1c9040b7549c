// Command meshnode is the one binary of a meshnode mesh: it runs a node, and its client verbs
// talk to a running node. main only parses, builds, runs and maps an error to an exit code.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/meshnode/meshnode/sandbox"

	"github.com/spf13/cobra"
)

// Exit codes (DESIGN §11): 0 success, 1 a refused or failed operation, 2 a usage error.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// usageError marks an error as the caller's mistake in flags, arguments or configuration:
// it exits 2.
type usageError struct {
	err   error
	usage string // the command's usage line, when the mistake is in its arguments or flags
}

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns a usageError with a formatted message.
func usagef(format string, args ...any) error {
	return usageError{err: fmt.Errorf(format, args...)}
}

// errReported is returned by a command that has already written its failure to stderr (for
// example every refusal of `module check`); main exits 1 without printing anything more.
var errReported = errors.New("failure already reported")

func main() {
	sandbox.Launcher() // started by a node as its modules' launcher: never returns
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// nodeCommands are the commands that run a node until a signal (runNode).
var nodeCommands = map[string]bool{"up": true, "run": true, "join": true}

// commandContext is the context a command runs in: for a node's command, one that SIGINT
// and SIGTERM end, caught from the start (a signal while it reads its flags, founds its mesh
// or asks for its credentials would otherwise kill it with the default action instead of
// stopping it, exit 0); for the others the background, which a signal ends as usual.
func commandContext(args []string) (context.Context, context.CancelFunc) {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			continue // a flag before the command
		}
		if nodeCommands[a] {
			return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		}
		break
	}
	return context.Background(), func() {}
}

// run executes the CLI with args and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := commandContext(args)
	defer stop()
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	return exitCode(err, stderr)
}

// exitCode maps err to an exit code, printing it to stderr unless it was already reported.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, errReported) {
		return exitFailed
	}
	fmt.Fprintf(stderr, "meshnode: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		if ue.usage != "" {
			fmt.Fprintf(stderr, "usage: %s\n", ue.usage)
		}
		return exitUsage
	}
	return exitFailed
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "meshnode",
		Short:         "One binary per machine: a NATS mesh whose permissions are derived from module manifests",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// Flag parsing errors are usage errors (exit 2).
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err, c.UseLine()} })
	root.AddCommand(
		newUpCmd(),
		newGenesisCmd(),
		newRunCmd(),
		newJoinCmd(),
		newStatusCmd(),
		newUICmd(),
		newContextCmd(),
		newModuleCmd(),
		newEmitCmd(),
		newListenCmd(),
		newCallCmd(),
		newSeatCmd(),
		newArtifactCmd(),
		newDeployCmd(),
		newUndeployCmd(),
		newPsCmd(),
		newLogsCmd(),
		newGitCmd(),
		newBuildsCmd(),
		newProvisionsCmd(),
		newMembersCmd(),
		newLeaveCmd(),
		newGrowCmd(),
		newCertCmd(),
		newNodeCmd(),
		newVaultCmd(),
		newTokenCmd(),
		newAuditCmd(),
		newDeadCmd(),
		newSnapshotCmd(),
		newBenchCmd(),
		newVersionCmd(),
	)
	// cobra adds completion at Execute, after argsAreUsage would have seen it: `completion
	// bogus` printed the help and exited 0. Added here, it is checked like every group.
	root.InitDefaultCompletionCmd()
	argsAreUsage(root)
	completeNames(root)
	return root
}

// groupAnnotation marks a command that only groups others (argsAreUsage gives it a RunE).
const groupAnnotation = "meshnode-group"

// argsAreUsage makes every wrong argument a usage error (exit 2, with the usage line): each
// command's argument check, and an unknown subcommand of a command that only groups others
// (cobra calls that an unknown command, with exit 1, or prints the help and exits 0).
func argsAreUsage(c *cobra.Command) {
	if !c.Runnable() && c.HasSubCommands() {
		c.Annotations = map[string]string{groupAnnotation: "true"}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q for %q; `%s --help` lists its commands", args[0], cmd.CommandPath(), cmd.CommandPath()),
					cmd.CommandPath() + " COMMAND"}
			}
			return cmd.Help()
		}
	} else if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return usageError{err, cmd.UseLine()}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		argsAreUsage(sub)
	}
}
