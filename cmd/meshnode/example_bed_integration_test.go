//go:build integration

package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
)

// exampleBed is where an example module written without the sdk runs: a node, shop (emits
// order.placed), notes — the example's manifest: it consumes shop's orders, emits
// note.written and answers status — and reader, whose sdk checks every note. The node's
// client port is TLS, as every node's off loopback is: the example must trust the mesh's CA
// that MESH_CA names, as a deployed module is given it.
type exampleBed struct {
	dir                             string
	p                               *process
	shopSeed, notesSeed, readerSeed string
}

func newExampleBed(t *testing.T) exampleBed {
	dir := t.TempDir()
	b := exampleBed{dir: dir, p: startNode(t, "up", append(upArgs(dir, "alpha"), "--client-tls", "always")...)}
	b.shopSeed = registerModule(t, dir, "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	b.notesSeed = registerModule(t, dir, "module: notes\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\nemits: [note.written]\ntools: [status]\n")
	b.readerSeed = registerModule(t, dir, "module: reader\nrequires: [mesh-bus]\nconsumes: [notes.note.written]\n")
	return b
}

// ca is the mesh's CA certificate, which the bed's clients trust.
func (b exampleBed) ca() string { return filepath.Join(b.dir, meshca.CAFile) }

// runNotes starts the example (argv, in dir) as module notes against the bed's node and
// waits until it says it is ready; it is interrupted when the test ends, and what it said is
// logged if the test failed.
func (b exampleBed) runNotes(t *testing.T, ctx context.Context, dir string, argv ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "MESHNODE_URL="+b.p.clientURL, "MESHNODE_SEED="+b.notesSeed, "MESH_CA="+b.ca())
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

// awaitNote waits for the example's note.written answering shop's event okID, as reader's
// sdk delivers it on got (its checks passed: signature, source), and returns it.
func awaitNote(t *testing.T, ctx context.Context, got <-chan sdk.Event, okID, example string) sdk.Event {
	t.Helper()
	select {
	case e := <-got:
		if e.Source != "notes" || e.Causation != okID || !strings.Contains(string(e.Data), okID) {
			t.Errorf("the note: source %q, causation %q, body %s; want notes, %s", e.Source, e.Causation, e.Data, okID)
		}
		return e
	case <-ctx.Done():
		t.Fatalf("no note.written from %s reached the Go reader", example)
		return sdk.Event{}
	}
}

// forge publishes, as the operator, an event on shop's subject signed by shop's key but
// naming module reader as its x-source — what the example's checks must refuse — and returns
// the operator's connection (closed when the test ends).
func (b exampleBed) forge(t *testing.T) *nats.Conn {
	t.Helper()
	op, err := dialWith(b.p.clientURL, filepath.Join(b.dir, datadir.OperatorSeedFile), sdk.TrustCA(b.ca()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Close)
	subject := manifest.EventSubject("shop", "order.placed")
	body := []byte(`{"order":3}`)
	h, err := envelope.Stamp(mustSeed(t, b.shopSeed), "reader", "alpha", subject, body, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.PublishMsg(&nats.Msg{Subject: subject, Header: h, Data: body}); err != nil {
		t.Fatal(err)
	}
	return op
}

// deadLetters waits until the node holds n dead letters and returns them.
func (b exampleBed) deadLetters(t *testing.T, n int, within time.Duration) []deadRow {
	t.Helper()
	var letters []deadRow
	retryUntil(t, within, func() (err error) {
		letters, err = deadLs(t, b.dir)
		if err != nil || len(letters) != n {
			return fmt.Errorf("dead letters %+v: %v, want %d", letters, err, n)
		}
		return nil
	})
	return letters
}
