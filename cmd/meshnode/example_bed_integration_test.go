//go:build integration

package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// exampleBed is where an example module written without the sdk runs: a node, shop (emits
// order.placed), notes — the example's manifest: it consumes shop's orders, emits
// note.written and answers status — and reader, whose sdk checks every note.
type exampleBed struct {
	dir                             string
	p                               *process
	shopSeed, notesSeed, readerSeed string
}

func newExampleBed(t *testing.T) exampleBed {
	dir := t.TempDir()
	b := exampleBed{dir: dir, p: startNode(t, "up", upArgs(dir, "alpha")...)}
	b.shopSeed = registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	b.notesSeed = registerModule(t, dir, "module: notes\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\nemits: [note.written]\ntools: [status]\n")
	b.readerSeed = registerModule(t, dir, "module: reader\nrequires: [mesh-bus]\nconsumes: [notes.note.written]\n")
	return b
}

// runNotes starts the example (argv, in dir) as module notes against the bed's node and
// waits until it says it is ready; it is interrupted when the test ends, and what it said is
// logged if the test failed.
func (b exampleBed) runNotes(t *testing.T, ctx context.Context, dir string, argv ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MESHNODE_URL="+b.p.clientURL, "MESHNODE_SEED="+b.notesSeed)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	ready := make(chan struct{})
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			mu.Lock()
			lines = append(lines, s.Text())
			mu.Unlock()
			if strings.Contains(s.Text(), " ready notes") {
				close(ready)
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		mu.Lock()
		defer mu.Unlock()
		if t.Failed() {
			t.Logf("%s said:\n%s\n%s", strings.Join(argv, " "), strings.Join(lines, "\n"), stderr.String())
		}
	})
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not start: %s", strings.Join(argv, " "), stderr.String())
	}
}
