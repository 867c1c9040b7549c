package build

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
)

// The mesh-git holder's work on a node's local bare repositories, through git itself: the
// branches' heads, the paths a change touched, and a commit's tree as a tar archive (git
// archive; nothing here packs or diffs by hand).

// Pushed is the mesh-git seat's `pushed` event: a branch of a repository moved to Commit
// (from Before; "" for a new branch).
type Pushed struct {
	Repository string `json:"repository"`
	Ref        string `json:"ref"`
	Commit     string `json:"commit"`
	Before     string `json:"before,omitempty"`
}

var commitRE = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// ValidCommit reports whether s is a full commit id (SHA-1 or SHA-256).
func ValidCommit(s string) bool { return commitRE.MatchString(s) }

// git runs git with args in the repository at dir and returns its standard output.
func git(ctx context.Context, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"--git-dir", dir}, args...)...)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM=1", "HOME=/nonexistent"}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return out.Bytes(), nil
}

// Heads returns the repository's branches and the commit each points at.
func Heads(ctx context.Context, dir string) (map[string]string, error) {
	out, err := git(ctx, dir, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/")
	if err != nil {
		return nil, err
	}
	heads := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		ref, commit, ok := strings.Cut(line, " ")
		if ok && ValidCommit(commit) {
			heads[ref] = commit
		}
	}
	return heads, nil
}

// Changed returns the paths commit changed since before ("": every path of commit).
func Changed(ctx context.Context, dir, before, commit string) ([]string, error) {
	if !ValidCommit(commit) || (before != "" && !ValidCommit(before)) {
		return nil, errors.New("a commit is a full hex commit id")
	}
	var out []byte
	var err error
	if before == "" {
		out, err = git(ctx, dir, "ls-tree", "-r", "--name-only", commit)
	} else {
		out, err = git(ctx, dir, "diff", "--name-only", "--no-renames", before, commit)
	}
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, p := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if p != "" {
			paths = append(paths, p)
		}
	}
	return paths, nil
}

// Archive writes commit's tree to w as a tar archive (git archive).
func Archive(ctx context.Context, dir, commit string, w io.Writer) error {
	if !ValidCommit(commit) {
		return errors.New("a commit is a full hex commit id")
	}
	cmd := exec.CommandContext(ctx, "git", "--git-dir", dir, "archive", "--format=tar", commit)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM=1", "HOME=/nonexistent"}
	var errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = w, &errOut
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", commit, err, strings.TrimSpace(errOut.String()))
	}
	return nil
}

// Touches reports whether any of paths lies under path ("." is the whole repository).
func Touches(paths []string, path string) bool {
	if path == "." {
		return len(paths) > 0
	}
	prefix := strings.TrimSuffix(path, "/") + "/"
	for _, p := range paths {
		if p == path || strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}
