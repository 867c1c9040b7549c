package main

import (
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// TestUsageErrorsExit2: every mistake in how a command is called — an unknown command, an
// unknown flag, a wrong number of arguments — exits 2 and prints the usage line, for every
// command of the CLI; none of them runs anything.
func TestUsageErrorsExit2(t *testing.T) {
	var walk func(c *cobra.Command)
	checked := 0
	walk = func(c *cobra.Command) {
		path := strings.Fields(c.CommandPath())[1:]
		try := func(what string, args ...string) {
			t.Helper()
			var out, errb strings.Builder
			code := run(append(append([]string{}, path...), args...), &out, &errb)
			if code != exitUsage || !strings.Contains(errb.String(), "usage: ") {
				t.Errorf("meshnode %s (%s): exit %d, want %d with the usage line\n%s", strings.Join(append(path, args...), " "), what, code, exitUsage, errb.String())
			}
			checked++
		}
		if !c.Hidden && c.Name() != "help" && c.Name() != "completion" {
			try("an unknown flag", "--no-such-flag")
			switch {
			case c.HasSubCommands():
				try("an unknown command", "no-such-command")
			case c.Args != nil && c.Args(c, []string{"a", "b", "c", "d", "e", "f"}) != nil:
				try("too many arguments", "a", "b", "c", "d", "e", "f")
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	if checked < 50 {
		t.Fatalf("only %d calls checked: the walk missed the commands", checked)
	}
}

// TestCatchEarly: a node's command catches SIGTERM from main's start (a signal before its
// run loop stops it, exit 0, instead of killing it); another command does not.
func TestCatchEarly(t *testing.T) {
	defer func() {
		if early != nil {
			signal.Stop(early)
		}
		early = nil
	}()
	for _, args := range [][]string{{"status", "--json"}, {"--log-level", "info"}, {}, {"module", "run"}} {
		catchEarly(args)
		if early != nil {
			t.Fatalf("%q catches signals early", args)
		}
	}
	catchEarly([]string{"--config=x", "run", "--data-dir", "d"})
	if early == nil {
		t.Fatal("run does not catch signals early")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-early:
		if s != syscall.SIGTERM {
			t.Fatalf("caught %v", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM was not caught")
	}
}
