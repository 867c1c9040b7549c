package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestUpgradeFrom: the repository names one commit for the upgrade beds, and it is in this
// checkout's history, so the beds can build it.
func TestUpgradeFrom(t *testing.T) {
	rev := testbed.UpgradeFrom(t)
	if _, err := exec.Command("git", "rev-parse", "--show-toplevel").Output(); err != nil {
		testbed.Skip(t, "no git checkout, so %s cannot be looked up: %v", rev[:7], err)
	}
	if out, err := exec.Command("git", "cat-file", "-t", rev).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "commit" {
		t.Fatalf("%s names %s, which is no commit of this checkout (%v: %s); a shallow clone lacks it: fetch the history", testbed.UpgradeFromFile, rev, err, out)
	}
}
