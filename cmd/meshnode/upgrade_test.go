package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// upgradeFromFile names, from cmd/meshnode, the file that holds the oldest commit whose
// nodes must interoperate with the current code.
var upgradeFromFile = filepath.Join("..", "..", "UPGRADE_FROM")

var commitHash = regexp.MustCompile(`^[0-9a-f]{40}$`)

// readUpgradeFrom reads the commit of path: its one line that is not blank or a # comment,
// a full commit hash.
func readUpgradeFrom(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read the upgrade bed's reference: %w", err)
	}
	defer f.Close()
	var commits []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			commits = append(commits, line)
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(commits) != 1 || !commitHash.MatchString(commits[0]) {
		return "", fmt.Errorf("%s holds %q: want one full commit hash (40 lowercase hex digits) beside # comments", path, commits)
	}
	return commits[0], nil
}

// TestUpgradeFrom: the repository names one commit for the upgrade bed, and it is in this
// checkout's history, so the bed can build it.
func TestUpgradeFrom(t *testing.T) {
	rev, err := readUpgradeFrom(upgradeFromFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.Command("git", "rev-parse", "--show-toplevel").Output(); err != nil {
		testbed.Skip(t, "no git checkout, so %s cannot be looked up: %v", rev[:7], err)
	}
	if out, err := exec.Command("git", "cat-file", "-t", rev).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "commit" {
		t.Fatalf("%s names %s, which is no commit of this checkout (%v: %s); a shallow clone lacks it: fetch the history", upgradeFromFile, rev, err, out)
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
			path := filepath.Join(t.TempDir(), "UPGRADE_FROM")
			os.WriteFile(path, []byte(text), 0o644)
			if rev, err := readUpgradeFrom(path); err == nil {
				t.Fatalf("readUpgradeFrom(%q) = %s, want an error", text, rev)
			}
		})
	}
}
