// Package testbed is what the tests share about where they run. A bed that cannot run on
// this machine skips through Skip, which fails instead where CI says every bed must run: a
// skipped bed there would be a green run that proved nothing.
package testbed

import (
	"fmt"
	"os"
	"testing"
)

// MustRunEnv is the environment variable CI sets to MustRun: then no bed may skip.
const MustRunEnv = "MESHNODE_BEDS"

// MustRun is MustRunEnv's value in CI.
const MustRun = "must-run"

// Skip skips t, saying why the bed cannot run here, or fails it when MustRunEnv is MustRun.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if os.Getenv(MustRunEnv) == MustRun {
		t.Fatalf("this bed must run here (%s=%s) but cannot: %s", MustRunEnv, MustRun, why)
	}
	t.Skip(why)
}
