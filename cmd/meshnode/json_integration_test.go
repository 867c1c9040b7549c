//go:build integration

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// TestIntegration_Binary_JSON runs every verb that prints records with --json against a real node, in
// an order that gives each something to print, and checks each with checkJSON. genesis,
// grow and builds are checked where the beds run them (genesis_test, the integration beds).
func TestIntegration_Binary_JSON(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	work := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(work, name)
		if err := os.WriteFile(path, []byte(text), 0o700); err != nil {
			t.Fatal(err)
		}
		return path
	}
	shop := write("shop.yaml", "module: shop\nrequires: [mesh-bus, kv]\nemits: [order.placed]\nsecrets: [key]\nseats:\n  mailer: {scope: mesh, retain: 1h, accepts: [send]}\n")
	user := write("user.yaml", "module: user\nrequires: [mesh-bus]\nuses: [mailer]\nconsumes: [shop.order.placed]\n")
	script := write("shop.sh", "#!/bin/sh\nexec sleep 600\n")
	shopSeed := filepath.Join(work, "shop.nk")
	dd := []string{"--data-dir", dir}
	cfgHome := t.TempDir()
	env := []string{"XDG_CONFIG_HOME=" + cfgHome}
	if r := meshnode(t, env, "context", "add", "here", "--data-dir", dir); r.code != 0 {
		t.Fatalf("context add: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"vault", "mint", "key", "--owner", "shop"}, dd...)...); r.code != 0 {
		t.Fatalf("vault mint: exit %d %s", r.code, r.stderr)
	}

	seen := map[string]int{} // records each verb printed
	run := func(path string, args ...string) []map[string]json.RawMessage {
		t.Helper()
		full := append(append(strings.Fields(path), args...), "--json")
		if c := leaves(newRootCmd())[path]; c != nil && c.Flags().Lookup("data-dir") != nil {
			full = append(full, dd...)
		}
		r := meshnode(t, env, full...)
		if r.code != 0 {
			t.Fatalf("meshnode %s: exit %d\n%s%s", strings.Join(full, " "), r.code, r.stdout, r.stderr)
		}
		recs := checkJSON(t, path, r.stdout)
		seen[path] += len(recs)
		return recs
	}
	run("version")
	run("status")
	run("members")
	run("module check", shop)
	run("module show", shop)
	run("module register", shop, "--creds-out", shopSeed)
	run("module register", user, "--creds-out", filepath.Join(work, "user.nk"))
	run("module ls")
	run("seat ls")
	run("seat pin", "user", "mailer", "v1")
	run("emit", "order.placed", `{"n":1}`, "--creds", shopSeed)
	run("vault ls")
	run("token create")
	run("artifact put", "shop", script, "--version", "1")
	run("artifact ls")
	run("deploy", "shop", "--version", "1", "--all", "--wait", "30s")
	run("ps")
	run("provisions")
	run("undeploy", "shop")
	run("context ls")
	run("vault recovery-key")
	snap := filepath.Join(work, "mesh.snap")
	run("snapshot save", snap)
	run("snapshot inspect", snap)
	deadLetter(t, p.clientURL, dir, shopSeed)
	run("dead ls")
	retryUntil(t, 10*time.Second, func() error {
		r := meshnode(t, nil, append([]string{"audit", "query", "--json", "--source", "shop"}, dd...)...)
		if r.code != 0 || !strings.Contains(r.stdout, "order.placed") {
			return fmt.Errorf("audit query: exit %d %s%s", r.code, r.stdout, r.stderr)
		}
		return nil
	})
	run("audit query")
	run("audit verify")
	run("audit tail", "-n", "2")
	// listen: until it has subscribed, an emitted event is not printed, so emit again.
	listen := exec.Command(binary, append([]string{"listen", "shop.**", "--json", "--count", "1"}, dd...)...)
	listen.Env = cleanEnv()
	out, err := listen.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := listen.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	retryUntil(t, 10*time.Second, func() error {
		run("emit", "order.placed", `{"n":2}`, "--creds", shopSeed)
		select {
		case line := <-lines:
			seen["listen"] += len(checkJSON(t, "listen", line))
			return nil
		case <-time.After(300 * time.Millisecond):
			return os.ErrDeadlineExceeded
		}
	})
	if err := listen.Wait(); err != nil {
		t.Fatalf("listen --count 1: %v", err)
	}
	r := meshnode(t, nil, "bench", "--events", "20", "--calls", "20", "--modules", "0", "--json")
	if r.code != 0 {
		t.Fatalf("bench --json: exit %d %s", r.code, r.stderr)
	}
	seen["bench"] += len(checkJSON(t, "bench", r.stdout))

	// Each verb printed a record: an empty output would check nothing.
	for path := range leaves(newRootCmd()) {
		if leaves(newRootCmd())[path].Flags().Lookup("json") == nil || slices.Contains([]string{"genesis", "grow", "builds"}, path) {
			continue
		}
		if seen[path] == 0 {
			t.Errorf("meshnode %s --json printed no record here: give it one, or check it where a bed does", path)
		}
	}
	p.stop(t, 15)
}

// deadLetter writes one dead letter to DEAD as the bus's dead-letter writer would: a shop
// event that consumer user gave up.
func deadLetter(t *testing.T, url, dir, shopSeed string) {
	t.Helper()
	op, err := dialWith(url, filepath.Join(dir, datadir.OperatorSeedFile))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	js, _ := jetstream.New(op)
	seed, err := os.ReadFile(shopSeed)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		t.Fatal(err)
	}
	subject := manifest.EventSubject("shop", "order.placed")
	body := []byte(`{"n":0}`)
	h, err := envelope.Stamp(kp, "shop", "alpha", subject, body, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.Set(envelope.DeadSubject, subject)
	h.Set(envelope.DeadConsumer, "user")
	h.Set(envelope.DeadReason, "max deliveries")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: manifest.DeadSubject(manifest.EventsStreamName, "user"), Header: h, Data: body}); err != nil {
		t.Fatal(err)
	}
}
