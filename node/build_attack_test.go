package node_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/testbed"
)

// TestCascade_BuildsReadNothingOutside (issue 33): a repository pushed by anyone who can
// push — a chain of links each climbing one directory more, ending in a main.go that names
// the node's operator seed; a build script that cats the seed by absolute and /proc paths;
// one that leaves $OUT a link to the seed — is built by the node's builder, and the seed
// appears in no event, no audit record, no artifact: nothing in the node's JetStream
// directory or its store holds it. The builds' own output does reach them, so the scan would
// find a seed there.
func TestCascade_BuildsReadNothingOutside(t *testing.T) {
	t.Parallel()
	repo := testbed.NewGitRepo(t)
	b := newBuilderBed(t, repo)
	seedFile := filepath.Join(b.dir, datadir.OperatorSeedFile)
	seed, err := os.ReadFile(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	seed = bytes.TrimSpace(seed)
	marker := "build-output-marker-" + strconv.Itoa(os.Getpid())

	// The chain: svc/d1/l -> .., svc/x -> d1/l/.., u1 -> x/.., …, main.go -> uN/<seed file>.
	svc := filepath.Join(repo.Work, "svc")
	os.MkdirAll(filepath.Join(svc, "d1"), 0o755)
	links := [][2]string{{"d1/l", ".."}, {"x", "d1/l/.."}}
	prev := "x"
	for i := 1; i <= strings.Count(seedFile, "/")+2; i++ {
		name := "u" + strconv.Itoa(i)
		links = append(links, [2]string{name, prev + "/.."})
		prev = name
	}
	links = append(links, [2]string{"main.go", prev + seedFile})
	for _, l := range links {
		if err := os.Symlink(l[1], filepath.Join(svc, l[0])); err != nil {
			t.Fatal(err)
		}
	}
	script := fmt.Sprintf("#!/bin/sh\necho %s\ncat main.go\ncat %s\ncat /proc/1/root%s\ncat /proc/$PPID/root%s\ncat main.go > \"$OUT\"\ncat %s >> \"$OUT\"\necho built >> \"$OUT\"\nexit 3\n",
		marker, seedFile, seedFile, seedFile, seedFile)
	os.WriteFile(filepath.Join(svc, "build.sh"), []byte(script), 0o755)
	os.MkdirAll(filepath.Join(repo.Work, "out"), 0o755)
	os.WriteFile(filepath.Join(repo.Work, "out", "build.sh"), []byte("#!/bin/sh\nln -s "+seedFile+" \"$OUT\"\n"), 0o755)
	repo.Git(repo.Work, "add", "-A")
	repo.Git(repo.Work, "commit", "-q", "-m", "attack")
	repo.Git(repo.Work, "push", "-q", "origin", "main")

	b.register("module: evil\nbuild: {from: shop/svc, run: sh build.sh}\n")
	b.register("module: planter\nbuild: {from: shop/out, run: sh build.sh}\n")
	b.notify(t)
	builds := b.builds(t, 2)
	for _, x := range builds {
		if x.Status != "failed" {
			t.Errorf("build of %s: %+v, want failed", x.Module, x)
		}
	}
	// Each module's builds had a cache (and, as root, a uid) of their own: what one build
	// wrote there is never another module's build's input.
	owners := map[uint32]bool{}
	for _, m := range []string{"evil", "planter"} {
		st, err := os.Stat(filepath.Join(b.dir, "build-cache", m))
		if err != nil {
			t.Fatalf("no build cache of %s's own: %v", m, err)
		}
		owners[st.Sys().(*syscall.Stat_t).Uid] = true
	}
	if os.Geteuid() == 0 && len(owners) != 2 {
		t.Errorf("the two modules' build caches have owners %v, want two uids", owners)
	}
	b.close() // everything it stored is on disk

	var sawMarker bool
	filepath.WalkDir(b.dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || path == seedFile {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if bytes.Contains(data, seed) {
			t.Errorf("the operator's seed is in %s", path)
		}
		if strings.Contains(path, "jetstream") && bytes.Contains(data, []byte(marker)) {
			sawMarker = true
		}
		return nil
	})
	if !sawMarker {
		t.Fatal("the builds' output is nowhere in JetStream's files: the scan proves nothing")
	}
}
