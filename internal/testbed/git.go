package testbed

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// GitRepo is a bare repository, as a node serves one to the build cascade, and a work tree
// that pushes to it.
type GitRepo struct {
	t          testing.TB
	Bare, Work string
}

// NewGitRepo makes an empty bare repository (branch main) and its work tree; without git
// the bed skips (fails where CI says every bed must run).
func NewGitRepo(t testing.TB) *GitRepo {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		Skip(t, "git is not installed: %v", err)
	}
	r := &GitRepo{t: t, Bare: filepath.Join(t.TempDir(), "shop.git"), Work: t.TempDir()}
	r.Git("", "init", "-q", "--bare", "-b", "main", r.Bare)
	r.Git(r.Work, "init", "-q", "-b", "main")
	r.Git(r.Work, "remote", "add", "origin", r.Bare)
	return r
}

// Git runs git in dir and returns its output.
func (r *GitRepo) Git(dir string, args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Push writes files (path → content, executable) into the work tree, commits them, pushes
// them to the bare repository and returns the commit.
func (r *GitRepo) Push(files map[string]string) string {
	r.t.Helper()
	for p, c := range files {
		path := filepath.Join(r.Work, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(c), 0o755); err != nil {
			r.t.Fatal(err)
		}
	}
	r.Git(r.Work, "add", "-A")
	r.Git(r.Work, "commit", "-q", "-m", "change")
	r.Git(r.Work, "push", "-q", "origin", "main")
	return r.Git(r.Work, "rev-parse", "HEAD")
}
