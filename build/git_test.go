package build_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/internal/testbed"
)

func TestGit_HeadsChangedArchive(t *testing.T) {
	ctx := context.Background()
	r := testbed.NewGitRepo(t)
	first := r.Push(map[string]string{"services/a/main.go": "a1", "services/b/main.go": "b1", "shared/lib.go": "s1"})
	heads, err := build.Heads(ctx, r.Bare)
	if err != nil || heads["refs/heads/main"] != first {
		t.Fatalf("heads %v %v, want main at %s", heads, err, first)
	}
	second := r.Push(map[string]string{"services/a/main.go": "a2"})
	changed, err := build.Changed(ctx, r.Bare, first, second)
	if err != nil || !slices.Equal(changed, []string{"services/a/main.go"}) {
		t.Fatalf("changed %v %v", changed, err)
	}
	if !build.Touches(changed, "services/a") || build.Touches(changed, "services/b") || build.Touches(changed, "services/ab") {
		t.Fatal("Touches does not tell services/a from services/b or services/ab")
	}
	all, _ := build.Changed(ctx, r.Bare, "", second)
	if len(all) != 3 || !build.Touches(all, ".") {
		t.Fatalf("a new branch's paths: %v", all)
	}
	var b bytes.Buffer
	if err := build.Archive(ctx, r.Bare, second, &b); err != nil {
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
	if err := build.Archive(ctx, r.Bare, "HEAD; rm -rf /", &b); err == nil {
		t.Fatal("Archive took a commit that is no commit id")
	}
}

// TestRun: a build runs in the module's path of the checked-out tree with its deps and a
// clean environment, and writes $OUT; a failing build returns its output; a slow one is
// stopped at the time limit; a path out of the tree is refused.
func TestRun(t *testing.T) {
	ctx := context.Background()
	sb, u := openSandbox(t)
	dir := func() string { d := t.TempDir(); testbed.Traversable(t, d); return d }
	r := testbed.NewGitRepo(t)
	commit := r.Push(map[string]string{"services/a/VERSION": "a1\n"})
	source := func() io.Reader {
		var b bytes.Buffer
		if err := build.Archive(ctx, r.Bare, commit, &b); err != nil {
			t.Fatal(err)
		}
		return &b
	}
	job := build.Job{Module: "a", Repository: "shop", Path: "services/a", Commit: commit}
	art, out, err := build.Run(ctx, dir(), build.Spec{Job: job, Source: source(), Sandbox: sb, User: u,
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
	// The source is read to its end, padding and all: an object store's reader checks its
	// digest only there, and its writer waits until then.
	whole := source().(*bytes.Buffer)
	if _, _, err := build.Run(ctx, dir(), build.Spec{Job: job, Source: whole, Sandbox: sb, User: u, Run: "echo x > \"$OUT\""}); err != nil || whole.Len() != 0 {
		t.Fatalf("build: %v; %d bytes of the source left unread", err, whole.Len())
	}
	if _, out, err := build.Run(ctx, dir(), build.Spec{Job: job, Source: source(), Sandbox: sb, User: u, Run: "echo oops; exit 2"}); err == nil || !strings.Contains(string(out), "oops") {
		t.Fatalf("a failing build: %v %q", err, out)
	}
	if _, _, err := build.Run(ctx, dir(), build.Spec{Job: job, Source: source(), Sandbox: sb, User: u, Run: "sleep 5", Timeout: 200 * time.Millisecond}); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("a slow build: %v", err)
	}
	job.Path = "../../etc"
	if _, _, err := build.Run(ctx, dir(), build.Spec{Job: job, Source: source(), Sandbox: sb, User: u, Run: "true"}); err == nil {
		t.Fatal("a path out of the tree was built")
	}
}
