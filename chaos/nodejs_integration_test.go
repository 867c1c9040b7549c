//go:build integration

package chaos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
)

// TestIntegration_JSModule: the Node.js module, run by StartJSModule against one real node
// whose client port is TLS (so it must trust the mesh's CA it is given), consumes an event
// a Go module emits and answers it with its own; the History holds its delivery of the one
// and its acked emit of the other, under the id the Go reader receives.
func TestIntegration_JSModule(t *testing.T) {
	dir := t.TempDir()
	url := startJSBedNode(t, dir)
	ca := filepath.Join(dir, meshca.CAFile)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	op, err := nats.Connect(url, nkeyFrom(t, filepath.Join(dir, datadir.OperatorSeedFile)),
		nats.CustomInboxPrefix(manifest.OperatorInbox), sdk.TrustCA(ca))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	seeds := map[string]string{}
	for _, text := range []string{
		"module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n",
		"module: notes\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\nemits: [note.written]\n",
		"module: reader\nrequires: [mesh-bus]\nconsumes: [notes.note.written]\n",
	} {
		reg, err := admin.Register(ctx, op, []byte(text))
		if err != nil {
			t.Fatalf("register %q: %v", text, err)
		}
		seeds[reg.Module] = filepath.Join(dir, reg.Module+".nk")
		if err := os.WriteFile(seeds[reg.Module], reg.Seed, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	h := NewHistory()
	js, err := StartJSModule(t, url, seeds["notes"], ca, "notes", h)
	if err != nil {
		t.Fatal(err)
	}
	notes := make(chan sdk.Event, 4)
	reader, err := sdk.Connect(ctx, url, seeds["reader"], sdk.RootCA(ca))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if err := reader.On("notes.note.written", func(_ context.Context, e sdk.Event) error { notes <- e; return nil }); err != nil {
		t.Fatal(err)
	}
	shop, err := sdk.Connect(ctx, url, seeds["shop"], sdk.RootCA(ca))
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	orderID, err := shop.Emit(ctx, "order.placed", map[string]any{"order": 1})
	if err != nil {
		t.Fatal(err)
	}
	var note sdk.Event
	select {
	case note = <-notes:
	case <-ctx.Done():
		t.Fatalf("no note from the Node.js module; its output:\n%s", js.Log())
	}

	// Its delivery line comes after its emit was acked (it acks the order last): wait for it.
	testbed.RetryUntil(t, 20*time.Second, func() error {
		if deliveries(h, "notes", orderID) == 0 {
			return fmt.Errorf("no delivery of %s to notes in the history: %v", orderID, h.Ops())
		}
		return nil
	})
	js.Stop()
	var emits []Op
	for _, o := range h.Ops() {
		if o.Kind == "emit" {
			emits = append(emits, o)
		}
	}
	if len(emits) != 1 || emits[0].Process != "notes" || emits[0].Key != note.ID || emits[0].Value != "note.written" || !emits[0].OK {
		t.Errorf("the history's emits %v, want notes' acked note.written %s", emits, note.ID)
	}
	if n := deliveries(h, "notes", orderID); n != 1 {
		t.Errorf("notes delivered %s %d times in the history, want once: %v", orderID, n, h.Ops())
	}
	if !strings.Contains(js.Log(), "ready notes") {
		t.Errorf("the module's log lacks its ready line:\n%s", js.Log())
	}
	if t.Failed() {
		t.Logf("the module's output:\n%s", js.Log())
	}
}

// deliveries counts the completed deliveries of event id to module in h.
func deliveries(h *History, module, id string) int {
	n := 0
	for _, o := range h.Ops() {
		if o.Kind == "deliver" && o.Process == module && o.Key == id && o.OK && o.Value == manifest.EventSubject("shop", "order.placed") {
			n++
		}
	}
	return n
}

// jsBedReadyRE is a node's ready line, which names its client URL.
var jsBedReadyRE = regexp.MustCompile(`^meshnode ready: node \S+, mesh \S+, client (\S+), http \S+$`)

// startJSBedNode builds meshnode and runs one node in dir, on loopback with a TLS client
// port (client-tls always: what every node off loopback has), until the test ends; it
// returns the node's client URL.
func startJSBedNode(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "meshnode")
	build := exec.Command("go", "build", "-o", bin, "./cmd/meshnode")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build meshnode: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "up", "--data-dir", dir, "--name", "alpha",
		"--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--client-tls", "always")
	cmd.Env = moduleEnv() // none of the test's settings (CI sets MESHNODE_BEDS) may reach the node
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &testbed.SyncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := jsBedReadyRE.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	select {
	case url := <-urls:
		return url
	case <-exited:
		t.Fatalf("meshnode up exited before ready: %s\n%s", cmd.ProcessState, stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("meshnode up not ready after 60s\n%s", stderr)
	}
	return ""
}

// nkeyFrom is the nats option authenticating with the seed in file.
func nkeyFrom(t *testing.T, file string) nats.Option {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(file)
	if err != nil {
		t.Fatal(err)
	}
	return opt
}
