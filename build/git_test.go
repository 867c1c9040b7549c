package build_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/internal/testbed"
)

// repo is a bare repository and a work tree that pushes to it.
type repo struct {
	t          *testing.T
	bare, work string
}

func newRepo(t *testing.T) *repo {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		testbed.Skip(t, "git is not installed: %v", err)
	}
	r := &repo{t: t, bare: filepath.Join(t.TempDir(), "shop.git"), work: t.TempDir()}
	r.run("", "init", "--bare", "-b", "main", r.bare)
	r.run(r.work, "init", "-b", "main")
	r.run(r.work, "remote", "add", "origin", r.bare)
	return r
}

func (r *repo) run(dir string, args ...string) string {
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

// commit writes files (path → content) and pushes them; it returns the commit.
func (r *repo) commit(files map[string]string) string {
	r.t.Helper()
	for p, c := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(r.work, p)), 0o755)
		if err := os.WriteFile(filepath.Join(r.work, p), []byte(c), 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
	r.run(r.work, "add", "-A")
	r.run(r.work, "commit", "-q", "-m", "change")
	r.run(r.work, "push", "-q", "origin", "main")
	return r.run(r.work, "rev-parse", "HEAD")
}

func TestGit_HeadsChangedArchive(t *testing.T) {
	ctx := context.Background()
	r := newRepo(t)
	first := r.commit(map[string]string{"services/a/main.go": "a1", "services/b/main.go": "b1", "shared/lib.go": "s1"})
	heads, err := build.Heads(ctx, r.bare)
	if err != nil || heads["refs/heads/main"] != first {
		t.Fatalf("heads %v %v, want main at %s", heads, err, first)
	}
	second := r.commit(map[string]string{"services/a/main.go": "a2"})
	changed, err := build.Changed(ctx, r.bare, first, second)
	if err != nil || !slices.Equal(changed, []string{"services/a/main.go"}) {
		t.Fatalf("changed %v %v", changed, err)
	}
	if !build.Touches(changed, "services/a") || build.Touches(changed, "services/b") || build.Touches(changed, "services/ab") {
		t.Fatal("Touches does not tell services/a from services/b or services/ab")
	}
	all, _ := build.Changed(ctx, r.bare, "", second)
	if len(all) != 3 || !build.Touches(all, ".") {
		t.Fatalf("a new branch's paths: %v", all)
	}
	var b bytes.Buffer
	if err := build.Archive(ctx, r.bare, second, &b); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&b)
	found := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		found[h.Name] = string(body)
	}
	if found["services/a/main.go"] != "a2" || found["shared/lib.go"] != "s1" {
		t.Fatalf("archive holds %v", found)
	}
	if err := build.Archive(ctx, r.bare, "HEAD; rm -rf /", &b); err == nil {
		t.Fatal("Archive took a commit that is no commit id")
	}
}

// TestRun: a build runs in the module's path of the checked-out tree with its deps and a
// clean environment, and writes $OUT; a failing build returns its output; a slow one is
// stopped at the time limit; a path out of the tree is refused.
func TestRun(t *testing.T) {
	ctx := context.Background()
	r := newRepo(t)
	commit := r.commit(map[string]string{"services/a/VERSION": "a1\n"})
	source := func() io.Reader {
		var b bytes.Buffer
		if err := build.Archive(ctx, r.bare, commit, &b); err != nil {
			t.Fatal(err)
		}
		return &b
	}
	job := build.Job{Module: "a", Repository: "shop", Path: "services/a", Commit: commit}
	art, out, err := build.Run(ctx, t.TempDir(), build.Spec{Job: job, Source: source(),
		Run:  `cat "$DEPS/base" VERSION > "$OUT"; echo "$MODULE at $COMMIT"; env | sort | cut -d= -f1 | tr '\n' ' '`,
		Deps: map[string]io.Reader{"base": strings.NewReader("base-v7\n")}})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	got, _ := os.ReadFile(art)
	if string(got) != "base-v7\na1\n" {
		t.Fatalf("artifact %q", got)
	}
	if !strings.Contains(string(out), "a at "+commit) || strings.Contains(string(out), "USER") {
		t.Fatalf("output %q: want the job's environment and nothing of the node's", out)
	}
	if _, out, err := build.Run(ctx, t.TempDir(), build.Spec{Job: job, Source: source(), Run: "echo oops; exit 2"}); err == nil || !strings.Contains(string(out), "oops") {
		t.Fatalf("a failing build: %v %q", err, out)
	}
	if _, _, err := build.Run(ctx, t.TempDir(), build.Spec{Job: job, Source: source(), Run: "sleep 5", Timeout: 200 * time.Millisecond}); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("a slow build: %v", err)
	}
	job.Path = "../../etc"
	if _, _, err := build.Run(ctx, t.TempDir(), build.Spec{Job: job, Source: source(), Run: "true"}); err == nil {
		t.Fatal("a path out of the tree was built")
	}
}
