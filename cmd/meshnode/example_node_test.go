package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nkeys"
)

// nodeExample installs examples/node's packages (npm ci, from its committed lock file) and
// returns its directory; the test is skipped only on a machine without Node.js and npm.
func nodeExample(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			testbed.Skip(t, "%s is not installed: the Node.js example needs Node.js 20 and npm", tool)
		}
	}
	dir, err := filepath.Abs("../../examples/node")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".bin", "esbuild")); err != nil {
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return dir
}

// TestNodeExample_Vectors: the Node.js envelope code agrees with the Go code's test vectors,
// and gives each of the signature rule's edge cases the Go code's verdict.
func TestNodeExample_Vectors(t *testing.T) {
	dir := nodeExample(t)
	cmd := exec.Command("node", "vectors.js", "../../envelope/testdata/vectors.json")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "4 of 4 vectors ok") || !strings.Contains(string(out), edgeAgree(t)) {
		t.Fatalf("node vectors.js: %v\n%s", err, out)
	}
}

// mustSeed reads a module's seed file as a signing key.
func mustSeed(t *testing.T, seedFile string) nkeys.KeyPair {
	t.Helper()
	raw, err := os.ReadFile(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.ParseDecoratedNKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// notesPair is the Go side of the Node.js example's beds: a reader of notes' events, each
// sent on the channel, and shop, which emits what notes consumes. Both connect with opts
// (the CA a TLS client port needs) and close with the test.
func notesPair(ctx context.Context, t *testing.T, url, readerSeed, shopSeed string, opts ...sdk.Option) (<-chan sdk.Event, *sdk.Client) {
	t.Helper()
	got := make(chan sdk.Event, 4)
	reader, err := sdk.Connect(ctx, url, readerSeed, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close() })
	if err := reader.On("notes.note.written", func(_ context.Context, e sdk.Event) error { got <- e; return nil }); err != nil {
		t.Fatal(err)
	}
	shop, err := sdk.Connect(ctx, url, shopSeed, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shop.Close() })
	return got, shop
}
