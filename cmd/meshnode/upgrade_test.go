package main

import (
	"os"
	"os/exec"
	"path/filepath"
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

// TestReadUpgradeFrom_Refuses: a file without exactly one full hash is refused.
func TestReadUpgradeFrom_Refuses(t *testing.T) {
	for name, text := range map[string]string{
		"empty":      "# only a comment\n",
		"short hash": "c13f8d1\n",
		"two":        "c13f8d1678ca995bdbc4d165977d0c6931ba24d7\nc13f8d1678ca995bdbc4d165977d0c6931ba24d7\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), testbed.UpgradeFromFile)
			os.WriteFile(path, []byte(text), 0o644)
			if rev, err := testbed.ReadUpgradeFrom(path); err == nil {
				t.Fatalf("ReadUpgradeFrom(%q) = %s, want an error", text, rev)
			}
		})
	}
}
