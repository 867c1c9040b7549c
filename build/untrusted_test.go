package build_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Launcher() // builds start this test binary as their launcher
	os.Exit(m.Run())
}

// openSandbox opens a sandbox as a builder's node would, with a uid for builds when root.
func openSandbox(t *testing.T) (*sandbox.Sandbox, *sandbox.User) {
	t.Helper()
	sb, users := testbed.Sandbox(t, "builder", t.TempDir())
	if users == nil {
		return sb, nil
	}
	u, err := users.For("@build")
	if err != nil {
		t.Fatal(err)
	}
	return sb, u
}

// seedDir is a node's data dir with its operator seed, and a build directory inside it.
func seedDir(t *testing.T) (dataDir, seed, buildDir string) {
	t.Helper()
	dataDir = t.TempDir()
	testbed.Traversable(t, dataDir)
	seed = "SUOPERATORSEEDOFTHENODEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	if err := os.WriteFile(filepath.Join(dataDir, "operator.nk"), []byte(seed), 0o600); err != nil {
		t.Fatal(err)
	}
	buildDir, err := os.MkdirTemp(dataDir, "build-")
	if err != nil {
		t.Fatal(err)
	}
	return dataDir, seed, buildDir
}

// tarball is an archive of entries: name → content, or "-> target" for a link, or "/" for
// a directory, in the order given.
func tarball(t *testing.T, entries [][2]string) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644}
		switch {
		case strings.HasPrefix(e[1], "-> "):
			h.Typeflag, h.Linkname = tar.TypeSymlink, strings.TrimPrefix(e[1], "-> ")
		case e[1] == "/":
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e[1]))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e[1]))
		}
	}
	tw.Close()
	return &b
}

// TestRun_ChainedLinksReadNothingOutside: the repository of the attack — a chain of links
// each climbing one directory more, which passes a per-link check, ending in main.go that
// names the node's seed — and a build that reads absolute paths: neither reads the seed,
// and the output (which a failed event carries) holds none of it.
func TestRun_ChainedLinksReadNothingOutside(t *testing.T) {
	sb, u := openSandbox(t)
	dataDir, seed, dir := seedDir(t)
	entries := [][2]string{{"svc/", "/"}, {"svc/d1/", "/"}, {"svc/d1/l", "-> .."}, {"svc/x", "-> d1/l/.."}}
	prev := "x"
	depth := strings.Count(strings.TrimPrefix(dataDir, "/"), "/") + 4
	for i := 1; i <= depth; i++ {
		name := "u" + strconv.Itoa(i)
		entries = append(entries, [2]string{"svc/" + name, "-> " + prev + "/.."})
		prev = name
	}
	entries = append(entries, [2]string{"svc/main.go", "-> " + prev + dataDir + "/operator.nk"})
	job := build.Job{Module: "a", Repository: "shop", Path: "svc", Commit: strings.Repeat("a", 40)}
	run := fmt.Sprintf(`cat main.go; cat %s/operator.nk; cat /proc/1/root%s/operator.nk; ls %s; echo x > "$OUT"`, dataDir, dataDir, dataDir)
	_, out, err := build.Run(context.Background(), dir, build.Spec{Job: job, Source: tarball(t, entries), Run: run, Sandbox: sb, User: u})
	if strings.Contains(string(out), seed) || (err != nil && strings.Contains(err.Error(), seed)) {
		t.Fatalf("the build read the node's seed:\n%s\n%v", out, err)
	}
	if err != nil && !strings.Contains(err.Error(), "leaves the tree") {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "operator.nk") { // cat's complaint names what it was refused
		t.Fatalf("the build's reads were not refused, or not tried:\n%s", out)
	}
}

// TestRun_PlantedOutputIsNotFollowed: a build that leaves $OUT/artifact as a link to the
// node's seed (or anything but a regular file) yields no artifact, and the seed is read
// by nobody.
func TestRun_PlantedOutputIsNotFollowed(t *testing.T) {
	sb, u := openSandbox(t)
	dataDir, seed, dir := seedDir(t)
	job := build.Job{Module: "a", Repository: "shop", Path: "svc", Commit: strings.Repeat("b", 40)}
	for _, run := range []string{
		`ln -s ` + dataDir + `/operator.nk "$OUT"`,
		`ln -s ../../operator.nk "$OUT"`,
		`mkfifo "$OUT"`,
		`mkdir "$OUT"`,
	} {
		art, out, err := build.Run(context.Background(), dir, build.Spec{Job: job, Source: tarball(t, [][2]string{{"svc/f", "x"}}), Run: run, Sandbox: sb, User: u})
		if err == nil {
			b, _ := os.ReadFile(art)
			t.Fatalf("%s: an artifact was taken (%q)", run, b)
		}
		if strings.Contains(string(out), seed) {
			t.Fatalf("%s: the seed in the output", run)
		}
		os.RemoveAll(dir)
		os.Mkdir(dir, 0o700)
	}
}

// TestRun_AsItsOwnUser: under a root node a build runs as the builder's uid, with no
// capabilities and no_new_privs, read from the kernel.
func TestRun_AsItsOwnUser(t *testing.T) {
	sb, u := openSandbox(t)
	_, _, dir := seedDir(t)
	job := build.Job{Module: "a", Repository: "shop", Path: "svc", Commit: strings.Repeat("c", 40)}
	_, out, err := build.Run(context.Background(), dir, build.Spec{Job: job, Source: tarball(t, [][2]string{{"svc/f", "x"}}), Sandbox: sb, User: u,
		Run: `grep -E '^(Uid|CapEff|NoNewPrivs):' /proc/self/status; echo x > "$OUT"`})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "NoNewPrivs:\t1") {
		t.Errorf("no no_new_privs:\n%s", out)
	}
	if u == nil {
		return
	}
	if !strings.Contains(string(out), fmt.Sprintf("Uid:\t%d\t", u.UID)) || !strings.Contains(string(out), "CapEff:\t0000000000000000") {
		t.Fatalf("want uid %d and no capabilities:\n%s", u.UID, out)
	}
}

// TestRun_LogIsCapped: a build that prints without end costs the node a bounded buffer, and
// the output says it was cut.
func TestRun_LogIsCapped(t *testing.T) {
	sb, u := openSandbox(t)
	_, _, dir := seedDir(t)
	job := build.Job{Module: "a", Repository: "shop", Path: "svc", Commit: strings.Repeat("d", 40)}
	_, out, err := build.Run(context.Background(), dir, build.Spec{Job: job, Source: tarball(t, [][2]string{{"svc/f", "x"}}), Sandbox: sb, User: u,
		Run: `head -c 1000000 /dev/zero | tr '\0' 'y'; echo; echo the-end; exit 1`})
	if err == nil {
		t.Fatal("a failing build succeeded")
	}
	if len(out) > build.LogTail+200 || !strings.Contains(string(out), "earlier bytes of output cut") || !strings.HasSuffix(strings.TrimSpace(string(out)), "the-end") {
		t.Fatalf("output of %d bytes, want at most %d with a note of the cut and the end:\n%.300s", len(out), build.LogTail+200, out)
	}
}

// TestRun_PathThatIsALinkIsRefused: a module's build path that the repository makes a link
// (to the tree's root, or out of it) is not entered.
func TestRun_PathThatIsALinkIsRefused(t *testing.T) {
	sb, u := openSandbox(t)
	_, _, dir := seedDir(t)
	job := build.Job{Module: "a", Repository: "shop", Path: "svc", Commit: strings.Repeat("e", 40)}
	_, _, err := build.Run(context.Background(), dir, build.Spec{Job: job, Source: tarball(t, [][2]string{{"real/f", "x"}, {"svc", "-> real"}}),
		Sandbox: sb, User: u, Run: `echo x > "$OUT"`})
	if err == nil || !strings.Contains(err.Error(), "has no directory svc") {
		t.Fatalf("a build path that is a link: %v, want it refused", err)
	}
	// A path through a link that leaves the tree only through another link: a/b is the
	// tree's root, so a/b/k/k/k/t, read as written, stays in the tree; made through a/b it is
	// k/k/k/t, and names the directory above the build's (the data dir).
	os.RemoveAll(dir)
	os.Mkdir(dir, 0o700)
	job.Path = "k/k/k/t/" + filepath.Base(dir) // through t, a directory that is there: the build's own
	_, _, err = build.Run(context.Background(), dir, build.Spec{Job: job,
		Source:  tarball(t, [][2]string{{"a/", "/"}, {"a/b", "-> .."}, {"a/b/k/k/k/", "/"}, {"a/b/k/k/k/t", "-> ../../../../.."}}),
		Sandbox: sb, User: u, Run: `echo x > "$OUT"`})
	if err == nil || !strings.Contains(err.Error(), "a link out of the tree") {
		t.Fatalf("a build path through a link out of the tree: %v, want it refused", err)
	}
}

// TestRun_Unprivileged runs the build beds again as a builder node of an unprivileged user
// runs them: Landlock alone, in a cgroup delegated to it.
func TestRun_Unprivileged(t *testing.T) {
	testbed.RunTestsAsNobody(t, "^TestRun_(ChainedLinksReadNothingOutside|PlantedOutputIsNotFollowed|AsItsOwnUser|LogIsCapped|PathThatIsALinkIsRefused)$")
}

// TestRun_ReadsItsToolchainPaths: a build reads the directories its node's build-paths names
// (a toolchain outside /usr), and not without them.
func TestRun_ReadsItsToolchainPaths(t *testing.T) {
	sb, u := openSandbox(t)
	_, _, dir := seedDir(t)
	tool := t.TempDir()
	testbed.Traversable(t, tool)
	os.WriteFile(filepath.Join(tool, "compiler"), []byte("#!/bin/sh\necho compiled > \"$OUT\"\n"), 0o755)
	job := build.Job{Module: "a", Repository: "shop", Path: "svc", Commit: strings.Repeat("f", 40)}
	run := func(read []string) error {
		os.RemoveAll(dir)
		os.Mkdir(dir, 0o700)
		_, out, err := build.Run(context.Background(), dir, build.Spec{Job: job, Source: tarball(t, [][2]string{{"svc/f", "x"}}), Sandbox: sb, User: u,
			Read: read, Run: tool + "/compiler"})
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	if err := run([]string{tool}); err != nil {
		t.Fatalf("a build with its toolchain's path: %v", err)
	}
	if err := run(nil); err == nil {
		t.Fatal("a build ran a toolchain outside its paths")
	}
}
