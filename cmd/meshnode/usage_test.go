package main

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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
		if !c.Hidden && c.Name() != "help" {
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

// TestCommandContext: a node's command runs in a context SIGTERM ends, caught from the
// command's start (a signal before its run loop stops it, exit 0, instead of killing it);
// another command's is never ended by one.
func TestCommandContext(t *testing.T) {
	for _, args := range [][]string{{"status", "--json"}, {"--log-level", "info"}, {}, {"module", "run"}} {
		ctx, stop := commandContext(args)
		stop()
		if ctx.Done() != nil {
			t.Fatalf("%q runs in a context a signal ends", args)
		}
	}
	ctx, stop := commandContext([]string{"--config=x", "run", "--data-dir", "d"})
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not end run's context")
	}
}

// TestFlagValueNames: pflag takes a flag usage's first back-quoted text as its value's
// name in --help; a command there (`meshnode context ls`) garbled every client verb's help.
func TestFlagValueNames(t *testing.T) {
	var walk func(c *cobra.Command)
	checked := 0
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			checked++
			if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " ;(") {
				t.Errorf("%s --%s: its value is named %q in --help", c.CommandPath(), f.Name, name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	if checked < 50 {
		t.Fatalf("checked %d flags: the walk missed the commands", checked)
	}
}

// TestDurationFlags_Days: every duration flag of the CLI reads what the configuration file
// reads, days included (`token create --ttl 7d`), and refuses a signed value; pflag's own
// duration (also of type "duration") rejected the documented d suffix.
func TestDurationFlags_Days(t *testing.T) {
	var walk func(c *cobra.Command)
	checked := 0
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Value.Type() != "duration" {
				return
			}
			checked++
			if err := f.Value.Set("2d12h"); err != nil {
				t.Errorf("%s --%s 2d12h: %v", c.CommandPath(), f.Name, err)
			}
			if err := f.Value.Set("-1s"); err == nil {
				t.Errorf("%s --%s -1s: accepted a negative duration", c.CommandPath(), f.Name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	if checked < 4 {
		t.Fatalf("checked %d duration flags: the walk missed --ttl, --grace or --wait", checked)
	}
}
