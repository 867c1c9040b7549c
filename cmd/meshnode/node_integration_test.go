//go:build integration

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestIntegration_Binary_UpStatusStopRestart runs the real binary: up, status --json, a JetStream
// publish, SIGTERM, and a restart that keeps the identity and the stream's messages.
func TestIntegration_Binary_UpStatusStopRestart(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)

	resp, err := http.Get(p.httpURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz=%d", resp.StatusCode)
	}

	r := meshnode(t, nil, "status", "--json", "--data-dir", dir)
	if r.code != 0 {
		t.Fatalf("status exit %d: %s", r.code, r.stderr)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	for k, want := range map[string]any{"name": "alpha", "mesh_id": p.meshID, "client_url": p.clientURL, "ready": true} {
		if st[k] != want {
			t.Errorf("status %s=%v, want %v", k, st[k], want)
		}
	}
	for _, k := range []string{"version", "jetstream"} {
		if _, ok := st[k]; !ok {
			t.Errorf("status --json lacks %q", k)
		}
	}
	if r := meshnode(t, nil, "status", "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, "alpha") {
		t.Fatalf("status exit %d: %s%s", r.code, r.stdout, r.stderr)
	}

	publish(t, p.clientURL, dir, 5)

	code, took := p.stop(t, syscall.SIGTERM)
	if code != 0 {
		t.Fatalf("SIGTERM: exit %d, want 0\n%s", code, p.stderr)
	}
	if took > 5*time.Second {
		t.Fatalf("SIGTERM: took %s to exit, want under 5s", took)
	}
	if _, err := os.Stat(filepath.Join(dir, "node.json")); !os.IsNotExist(err) {
		t.Fatalf("node.json still there after a clean stop (err=%v)", err)
	}
	if r := meshnode(t, nil, "status", "--data-dir", dir); r.code != 1 || !strings.Contains(r.stderr, "meshnode up --data-dir") {
		t.Fatalf("status of a stopped node: exit %d %q, want 1 saying how to start it", r.code, r.stderr)
	}

	// Restart with run: the same identity and the stream's messages.
	p = startNode(t, "run", upArgs(dir, "alpha")...)
	if p.meshID != st["mesh_id"] {
		t.Fatalf("mesh id after restart %s, want %s", p.meshID, st["mesh_id"])
	}
	if got := streamMsgs(t, p.clientURL, dir); got != 5 {
		t.Fatalf("stream messages after restart=%d, want 5", got)
	}

	// kill -9 leaves a stale node.json; status says the node is gone, and it restarts.
	if code, _ := p.stop(t, syscall.SIGKILL); code != -1 {
		t.Fatalf("SIGKILL exit code %d", code)
	}
	if r := meshnode(t, nil, "status", "--data-dir", dir); r.code != 1 || !strings.Contains(r.stderr, "has exited") {
		t.Fatalf("status after kill -9: exit %d %q, want 1 saying the process exited", r.code, r.stderr)
	}
	p = startNode(t, "up", upArgs(dir, "alpha")...)
	if got := streamMsgs(t, p.clientURL, dir); got != 5 {
		t.Fatalf("stream messages after kill -9 and restart=%d, want 5", got)
	}
	if code, _ := p.stop(t, syscall.SIGINT); code != 0 {
		t.Fatalf("SIGINT: exit %d, want 0", code)
	}
}

func publish(t *testing.T, url, dir string, n int) {
	t.Helper()
	nc, err := operatorConn(url, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep.>"}}); err != nil {
		t.Fatal(err)
	}
	for range n {
		if _, err := js.Publish(ctx, "keep.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
}

func streamMsgs(t *testing.T, url, dir string) uint64 {
	t.Helper()
	nc, err := operatorConn(url, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "KEEP")
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// operatorConn connects to url as the operator of the node in dir.
func operatorConn(url, dir string) (*nats.Conn, error) {
	opt, err := nats.NkeyOptionFromSeed(filepath.Join(dir, "operator.nk"))
	if err != nil {
		return nil, err
	}
	return nats.Connect(url, opt)
}

// TestIntegration_Binary_NameMismatch: a data dir that holds another node is refused with the fix.
func TestIntegration_Binary_NameMismatch(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	p.stop(t, syscall.SIGTERM)
	r := meshnode(t, nil, append([]string{"up"}, upArgs(dir, "beta")...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "--name alpha") {
		t.Fatalf("exit %d %q, want 1 suggesting --name alpha", r.code, r.stderr)
	}
}

// TestIntegration_Binary_DataDirInUse: a second node on a running node's data dir is refused.
func TestIntegration_Binary_DataDirInUse(t *testing.T) {
	dir := t.TempDir()
	startNode(t, "up", upArgs(dir, "alpha")...)
	r := meshnode(t, nil, append([]string{"up"}, upArgs(dir, "alpha")...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "in use by a running meshnode") {
		t.Fatalf("exit %d %q, want 1 saying the data dir is in use", r.code, r.stderr)
	}
}
