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
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/sdk"
)

// TestIntegration_Binary_ModuleFlow drives the CLI as an operator would: register two modules, list
// them, listen while one emits, call a tool another serves, and remove one.
func TestIntegration_Binary_ModuleFlow(t *testing.T) {
	dir := t.TempDir()
	p := startNode(t, "up", upArgs(dir, "alpha")...)
	work := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(work, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	shop := write("shop.yaml", "module: shop\nrequires: [mesh-bus]\nemits: [order.placed]\n")
	billing := write("billing.yaml", "module: billing\nrequires: [mesh-bus]\nconsumes: [shop.order.placed]\ntools: [status]\n")
	bad := write("bad.yaml", "module: bad\nemits: [mesh.mod.x.event.y]\nconsumes: [\"module.x.#\"]\n")
	dd := []string{"--data-dir", dir}

	shopSeed := filepath.Join(work, "shop.nk")
	r := meshnode(t, nil, append([]string{"module", "register", shop, "--creds-out", shopSeed}, dd...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "registered shop") {
		t.Fatalf("register shop: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if st, err := os.Stat(shopSeed); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("seed file: %v %v", st, err)
	}
	seed, _ := os.ReadFile(shopSeed)
	if !strings.HasPrefix(string(seed), "SU") {
		t.Fatalf("seed file holds %q, want the nkey seed alone", seed)
	}
	// The seed is written once: a second registration to the same file is refused.
	if r := meshnode(t, nil, append([]string{"module", "register", shop, "--creds-out", shopSeed}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("register over an existing seed file: exit %d %s", r.code, r.stderr)
	}
	billingSeed := filepath.Join(work, "billing.nk")
	if r := meshnode(t, nil, append([]string{"module", "register", billing, "--creds-out", billingSeed}, dd...)...); r.code != 0 {
		t.Fatalf("register billing: exit %d %s", r.code, r.stderr)
	}
	// Every refusal is printed, and nothing is registered.
	r = meshnode(t, nil, append([]string{"module", "register", bad, "--creds-out", filepath.Join(work, "bad.nk")}, dd...)...)
	if r.code != 1 || strings.Count(r.stderr, "bad.yaml:") < 3 || !strings.Contains(r.stderr, "nothing was registered") {
		t.Fatalf("register bad: exit %d\n%s", r.code, r.stderr)
	}

	r = meshnode(t, nil, append([]string{"module", "ls"}, dd...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "billing") || !strings.Contains(r.stdout, "shop") || strings.Contains(r.stdout, "bad") {
		t.Fatalf("module ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// listen prints the event emit sends.
	listen := exec.Command(binary, append([]string{"listen", "shop.**", "--json", "--count", "1"}, dd...)...)
	listen.Env = cleanEnv()
	out, err := listen.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	listen.Stderr = os.Stderr
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
	var id string
	retryUntil(t, 10*time.Second, func() error {
		// Until listen has subscribed, an emitted event is not printed: emit again.
		r := meshnode(t, nil, append([]string{"emit", "order.placed", `{"order":1}`, "--creds", shopSeed}, dd...)...)
		if r.code != 0 {
			t.Fatalf("emit: exit %d %s", r.code, r.stderr)
		}
		id = strings.TrimSpace(r.stdout)
		select {
		case line := <-lines:
			var ev struct {
				Subject string            `json:"subject"`
				Key     string            `json:"key"`
				Headers map[string]string `json:"headers"`
				Body    json.RawMessage   `json:"body"`
			}
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("listen printed %q: %v", line, err)
			}
			if ev.Key != "shop.order.placed" || ev.Headers["x-source"] != "shop" || string(ev.Body) != `{"order":1}` {
				t.Fatalf("listen printed %+v", ev)
			}
			return nil
		case <-time.After(300 * time.Millisecond):
			return os.ErrDeadlineExceeded
		}
	})
	if err := listen.Wait(); err != nil {
		t.Fatalf("listen --count 1: %v", err)
	}
	if len(id) != 36 {
		t.Fatalf("emit printed %q, want the event id", id)
	}
	// emit refuses an undeclared event, saying what to declare, and a payload that is not JSON.
	if r := meshnode(t, nil, append([]string{"emit", "order.cancelled", `{}`, "--creds", shopSeed}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "emits:") {
		t.Fatalf("emit undeclared: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"emit", "order.placed", `{oops`, "--creds", shopSeed}, dd...)...); r.code != 2 {
		t.Fatalf("emit bad JSON: exit %d %s", r.code, r.stderr)
	}

	// call: nobody serves yet, then billing serves its status tool.
	if r := meshnode(t, nil, append([]string{"call", "billing", "status"}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "nobody serves") {
		t.Fatalf("call with no server: exit %d %s", r.code, r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdk.Connect(ctx, p.clientURL, billingSeed)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Serve("status", func(context.Context, sdk.Request) ([]byte, error) { return []byte(`{"ok":true}`), nil }); err != nil {
		t.Fatal(err)
	}
	if r := meshnode(t, nil, append([]string{"call", "billing", "status", "{}"}, dd...)...); r.code != 0 || strings.TrimSpace(r.stdout) != `{"ok":true}` {
		t.Fatalf("call: exit %d %q %s", r.code, r.stdout, r.stderr)
	}

	// A seat that shares its module's name (as the README's mailer does): the operator's call
	// reaches the seat's holder, not the module, which declares no tools.
	notifierSeed := filepath.Join(work, "notifier.nk")
	notifier := write("notifier.yaml", "module: notifier\nrequires: [mesh-bus]\nseats:\n  notifier:\n    scope: mesh\n    retain: 7d\n    accepts: [send]\n    serves: [status]\n")
	if r := meshnode(t, nil, append([]string{"module", "register", notifier, "--creds-out", notifierSeed}, dd...)...); r.code != 0 {
		t.Fatalf("register notifier: exit %d %s", r.code, r.stderr)
	}
	holder, err := sdk.Connect(ctx, p.clientURL, notifierSeed)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	err = holder.HoldSeat("notifier", sdk.SeatHandlers{
		Accepts: map[string]sdk.JobHandler{"send": func(context.Context, sdk.Job) error { return nil }},
		Serves:  map[string]sdk.ToolHandler{"status": func(context.Context, sdk.Request) ([]byte, error) { return []byte(`{"held":true}`), nil }},
	})
	if err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		r := meshnode(t, nil, append([]string{"call", "notifier", "status"}, dd...)...)
		if r.code != 0 || strings.TrimSpace(r.stdout) != `{"held":true}` {
			return fmt.Errorf("call notifier status: exit %d %q %s", r.code, r.stdout, r.stderr)
		}
		return nil
	})

	// seat ls shows the mesh's own controller seat, held by this node.
	r = meshnode(t, nil, append([]string{"seat", "ls", "--json"}, dd...)...)
	if r.code != 0 || !strings.Contains(r.stdout, `"seat":"mesh-controller"`) || !strings.Contains(r.stdout, `"holder":"alpha"`) {
		t.Fatalf("seat ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// git notify on a node that serves no repositories says how to serve one.
	if r := meshnode(t, nil, append([]string{"git", "notify", "shop"}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, `node alpha: it serves no repository "shop" (its git-repos: none); give the node git-repos: {shop: /path/to/shop.git} (or --git-repos shop=PATH)`) {
		t.Fatalf("git notify without repositories: exit %d %s", r.code, r.stderr)
	}

	// seat pin moves a user to v2 of a seat's protocol; seat ls then marks v1 retirable.
	mail := write("mail.yaml", "module: mail\nrequires: [mesh-bus]\nseats:\n  mailer:\n    scope: mesh\n    retain: 1h\n    accepts: [send]\n    versions: {v2: {accepts: [send]}}\n")
	user := write("user.yaml", "module: user\nrequires: [mesh-bus]\nuses: [mailer]\n")
	for _, f := range []string{mail, user} {
		if r := meshnode(t, nil, append([]string{"module", "register", f, "--creds-out", f + ".nk"}, dd...)...); r.code != 0 {
			t.Fatalf("register %s: exit %d %s", f, r.code, r.stderr)
		}
	}
	if r := meshnode(t, nil, append([]string{"seat", "pin", "user", "mailer", "v3"}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "it declares v1, v2") {
		t.Fatalf("seat pin to an undeclared version: exit %d %s", r.code, r.stderr)
	}
	r = meshnode(t, nil, append([]string{"seat", "pin", "user", "mailer", "v2"}, dd...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "pinned user to v2 of seat mailer (was v1)") || !strings.Contains(r.stdout, "retirable") {
		t.Fatalf("seat pin: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = meshnode(t, nil, append([]string{"seat", "ls"}, dd...)...)
	if r.code != 0 || !regexp.MustCompile(`(?m)^mailer .*v1 retirable; v2 user\s*$`).MatchString(r.stdout) {
		t.Fatalf("seat ls after the pin: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// The deploy path: an artifact, a deployment, ps, logs, provisions, undeploy.
	runner := write("runner.yaml", "module: runner\nrequires: [mesh-bus, kv]\n")
	script := write("runner.sh", "#!/bin/sh\necho \"hello from $MESH_NODE\"\nexec sleep 600\n")
	os.Chmod(script, 0o755)
	if r := meshnode(t, nil, append([]string{"module", "register", runner, "--creds-out", runner + ".nk"}, dd...)...); r.code != 0 {
		t.Fatalf("register runner: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"deploy", "runner", "--version", "1"}, dd...)...); r.code != 2 || !strings.Contains(r.stderr, "--all") {
		t.Fatalf("deploy without nodes: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"artifact", "put", "runner", script, "--version", "1"}, dd...)...); r.code != 0 || !strings.Contains(r.stdout, "stored runner 1") {
		t.Fatalf("artifact put: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"artifact", "ls", "--json"}, dd...)...); r.code != 0 || !strings.Contains(r.stdout, `"digest":"sha256:`) {
		t.Fatalf("artifact ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// --wait returns once the process runs (ps says so at once after it).
	if r := meshnode(t, nil, append([]string{"deploy", "runner", "--version", "1", "--all", "--wait", "30s"}, dd...)...); r.code != 0 || !strings.Contains(r.stdout, "alpha: declaration revision") || !strings.Contains(r.stdout, "alpha: running (1 of 1)") {
		t.Fatalf("deploy: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	{
		r := meshnode(t, nil, append([]string{"ps", "--json"}, dd...)...)
		var p struct {
			Module, Node, Version, State string
			Revision                     uint64
			PID                          int
			Restarts                     int
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &p) != nil || p.Module != "runner" || p.Node != "alpha" || p.State != "running" || p.PID == 0 || p.Revision == 0 {
			t.Fatalf("ps after deploy --wait: exit %d %s%s", r.code, r.stdout, r.stderr)
		}
	}
	retryUntil(t, 10*time.Second, func() error {
		if r := meshnode(t, nil, append([]string{"logs", "runner"}, dd...)...); r.code != 0 || !strings.Contains(r.stdout, "hello from alpha") {
			return fmt.Errorf("logs: exit %d %q %s", r.code, r.stdout, r.stderr)
		}
		return nil
	})
	r = meshnode(t, nil, append([]string{"provisions", "--json"}, dd...)...)
	var prov struct{ Consumer, Interface, Provider, State, Since string }
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &prov) != nil || prov.Consumer != "runner" || prov.Interface != "kv" || prov.Provider != "mesh" || prov.State != "ready" || prov.Since == "" {
		t.Fatalf("provisions --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"provisions"}, dd...)...); r.code != 0 || !regexp.MustCompile(`(?m)^runner\s+kv\s+mesh\s+ready\s`).MatchString(r.stdout) {
		t.Fatalf("provisions: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"provisions", "pin", "runner", "kv", "somewhere"}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "does not require kv from a seat") {
		t.Fatalf("provisions pin of the mesh's own kv: exit %d %s", r.code, r.stderr)
	}
	// --wait does not take a process that dies soon after it starts for a running one.
	crasher := write("crasher.yaml", "module: crasher\nrequires: [mesh-bus]\n")
	dies := write("crasher.sh", "#!/bin/sh\nsleep 0.3\nexit 3\n")
	os.Chmod(dies, 0o755)
	for _, args := range [][]string{{"module", "register", crasher, "--creds-out", crasher + ".nk"}, {"artifact", "put", "crasher", dies, "--version", "1"}} {
		if r := meshnode(t, nil, append(args, dd...)...); r.code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", args[0], r.code, r.stdout, r.stderr)
		}
	}
	if r := meshnode(t, nil, append([]string{"deploy", "crasher", "--version", "1", "--all", "--wait", "60s"}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "is crash-looping: exit status 3") {
		t.Fatalf("deploy --wait of a module that dies: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"undeploy", "crasher"}, dd...)...); r.code != 0 {
		t.Fatalf("undeploy crasher: exit %d %s", r.code, r.stderr)
	}
	// A module requiring what no seat provides waits, not started, and says why.
	waiter := write("waiter.yaml", "module: waiter\nrequires: [mesh-bus, postgres]\n")
	for _, args := range [][]string{{"module", "register", waiter, "--creds-out", waiter + ".nk"}, {"artifact", "put", "waiter", script, "--version", "1"}, {"deploy", "waiter", "--version", "1", "--all"}} {
		if r := meshnode(t, nil, append(args, dd...)...); r.code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", args[0], r.code, r.stdout, r.stderr)
		}
	}
	noSeat := "no seat provides postgres yet: register a module whose seat has provides: [postgres]"
	retryUntil(t, 10*time.Second, func() error {
		r := meshnode(t, nil, append([]string{"provisions", "--json"}, dd...)...)
		var rows []map[string]any
		for line := range strings.Lines(r.stdout) {
			var row map[string]any
			if err := json.Unmarshal([]byte(line), &row); err != nil {
				return fmt.Errorf("provisions --json: %q: %v", line, err)
			}
			rows = append(rows, row)
		}
		if r.code != 0 || len(rows) != 2 || rows[1]["consumer"] != "waiter" || rows[1]["state"] != "waiting" || rows[1]["provider"] != "" || rows[1]["reason"] != noSeat || rows[0]["reason"] != "" {
			return fmt.Errorf("provisions --json with a waiting module: exit %d %q %s", r.code, r.stdout, r.stderr)
		}
		if r := meshnode(t, nil, append([]string{"provisions"}, dd...)...); r.code != 0 || !regexp.MustCompile(`(?m)^waiter\s+postgres\s+-\s+waiting\s.*`+regexp.QuoteMeta(noSeat)).MatchString(r.stdout) {
			return fmt.Errorf("provisions with a waiting module: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		r = meshnode(t, nil, append([]string{"ps", "--json"}, dd...)...)
		for line := range strings.Lines(r.stdout) {
			var p struct {
				Module, State, Reason string
				PID                   int
			}
			if json.Unmarshal([]byte(line), &p) == nil && p.Module == "waiter" && p.State == "waiting" && p.PID == 0 && strings.Contains(p.Reason, "postgres") {
				return nil
			}
		}
		return fmt.Errorf("ps has no waiting waiter: exit %d %q %s", r.code, r.stdout, r.stderr)
	})
	// --wait gives up saying where each node stands and why.
	if r := meshnode(t, nil, append([]string{"deploy", "waiter", "--version", "1", "--all", "--wait", "1s"}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "0 of 1 instances of waiter run (alpha: instance 0: waiting (waiting on postgres") {
		t.Fatalf("deploy --wait of a waiting module: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"undeploy", "waiter"}, dd...)...); r.code != 0 {
		t.Fatalf("undeploy waiter: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"artifact", "rm", "runner", "--version", "1"}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "is deployed") {
		t.Fatalf("artifact rm of a deployed version: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"undeploy", "runner"}, dd...)...); r.code != 0 || !strings.Contains(r.stdout, "undeployed runner") {
		t.Fatalf("undeploy: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	retryUntil(t, 10*time.Second, func() error {
		if r := meshnode(t, nil, append([]string{"provisions", "--json"}, dd...)...); r.code != 0 || r.stdout != "" {
			return fmt.Errorf("provisions after undeploy: exit %d %q %s", r.code, r.stdout, r.stderr)
		}
		return nil
	})

	if r := meshnode(t, nil, append([]string{"module", "remove", "shop"}, dd...)...); r.code != 0 {
		t.Fatalf("remove: exit %d %s", r.code, r.stderr)
	}
	if r := meshnode(t, nil, append([]string{"emit", "order.placed", `{}`, "--creds", shopSeed}, dd...)...); r.code != 1 || !strings.Contains(r.stderr, "not registered") {
		t.Fatalf("emit after remove: exit %d %s", r.code, r.stderr)
	}
	p.stop(t, syscall.SIGTERM)
}
