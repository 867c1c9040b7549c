package testbed

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// UpgradeFromFile is the file at the repository's root that names the oldest commit whose
// nodes must interoperate with the current code: the upgrade beds start a mesh at it.
const UpgradeFromFile = "UPGRADE_FROM"

var commitHash = regexp.MustCompile(`^[0-9a-f]{40}$`)

// ReadUpgradeFrom reads the commit of path: its one line that is not blank or a # comment,
// a full commit hash.
func ReadUpgradeFrom(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read the upgrade beds' reference: %w", err)
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

// ModuleRoot is the directory of the go.mod of the module the test runs in.
func ModuleRoot(tb testing.TB) string {
	tb.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == os.DevNull {
		tb.Fatalf("find the meshnode module (go env GOMOD: %q, %v); run the test inside it", gomod, err)
	}
	return filepath.Dir(gomod)
}

// UpgradeFrom is the commit UPGRADE_FROM names.
func UpgradeFrom(tb testing.TB) string {
	tb.Helper()
	rev, err := ReadUpgradeFrom(filepath.Join(ModuleRoot(tb), UpgradeFromFile))
	if err != nil {
		tb.Fatal(err)
	}
	return rev
}

// BuildAt builds cmd/meshnode as it was at commit rev, from the checkout's history (git
// archive: no worktree is left behind), with env as the build's environment.
func BuildAt(tb testing.TB, rev string, env []string) string {
	tb.Helper()
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		Skip(tb, "the upgrade bed builds meshnode at %s from the checkout's git history, and this is no git checkout: %v", rev[:7], err)
	}
	src := tb.TempDir()
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", strings.TrimSpace(string(root)), rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		tb.Fatalf("unpack %s (a shallow clone lacks it: fetch the history): %v\n%s", rev[:7], err, out)
	}
	bin := filepath.Join(tb.TempDir(), "meshnode-"+rev[:7])
	build := exec.Command("go", "build", "-o", bin, "./cmd/meshnode")
	build.Dir, build.Env = src, env
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("build meshnode at %s: %v\n%s", rev[:7], err, out)
	}
	return bin
}
