package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// catalogueDir is the manifest package's test catalogue: realistic modules that pass.
var catalogueDir = filepath.Join("..", "..", "manifest", "testdata", "catalogue")

// runModule runs `meshnode module ARGS...` and returns its output and exit code, mapped as
// main maps them.
func runModule(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newModuleCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	code = exitCode(cmd.Execute(), &errOut)
	return out.String(), errOut.String(), code
}

// writeManifest writes a manifest into a temporary directory and returns its path.
func writeManifest(t *testing.T, dir, name, yaml string) string {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestModuleCheck_OK(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(catalogueDir, "*.yaml"))
	stdout, stderr, code := runModule(t, append([]string{"check"}, files...)...)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if got, want := strings.Count(stdout, ": ok (module "), len(files); got != want {
		t.Fatalf("%d ok lines, want %d:\n%s", got, want, stdout)
	}
}

func TestModuleCheck_EveryRefusal(t *testing.T) {
	path := writeManifest(t, "", "shop.yaml", `module: shop
emits: [order.*]
consumes: [mesh.mod.billing.event.order.placed, "#"]
seats:
  mesh-cart:
    scope: everywhere
    retain: 7 days
    accepts: [add]
`)
	stdout, stderr, code := runModule(t, "check", path)
	if code != exitFailed {
		t.Fatalf("exit %d, want %d", code, exitFailed)
	}
	if stdout != "" {
		t.Fatalf("stdout %q, want nothing", stdout)
	}
	for _, want := range []string{
		path + ": requires: does not hold mesh-bus",
		path + `:2: emits[0] "order.*": holds a wildcard`,
		path + `:3: consumes[0] "mesh.mod.billing.event.order.placed": is a subject; a manifest names things locally and the mesh derives every subject; write billing.order.placed`,
		path + `:3: consumes[1] "#": uses AMQP's wildcard #; the manifest's is **; write **`,
		path + `:5: seats.mesh-cart "mesh-cart": mesh-* seats are the mesh's own, and this is none of them; choose another name, e.g. cart`,
		path + `:6: seats.mesh-cart.scope "everywhere"`,
		path + `:7: seats.mesh-cart.retain "7 days"`,
		"7 refusals in 1 of 1 manifest\n",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if got, want := strings.Count(stderr, "\n"), 8; got != want {
		t.Errorf("%d lines on stderr, want %d (one per refusal and a summary):\n%s", got, want, stderr)
	}
}

func TestModuleCheck_Catalogue(t *testing.T) {
	dir := t.TempDir()
	taken := writeManifest(t, dir, "postman.yaml", "module: postman\nrequires: [mesh-bus]\nconsumes: [billing.order.shipped]\nseats:\n  mailer: {scope: mesh, retain: 1d, accepts: [send]}\n")
	breaking := writeManifest(t, dir, "mailer.yaml", "module: mailer\nrequires: [mesh-bus]\nemits: [bounce.received]\nseats:\n  mailer: {scope: mesh, retain: 7d, accepts: [deliver], serves: [status, quota]}\n")
	fine := writeManifest(t, dir, "fresh.yaml", "module: fresh\nrequires: [mesh-bus]\nconsumes: [billing.order.paid]\nuses: [mailer]\n")

	stdout, stderr, code := runModule(t, "check", "--catalogue", catalogueDir, taken, breaking, fine)
	if code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, stderr)
	}
	for _, want := range []string{
		taken + `:5: seats.mailer "mailer": is already declared by module mailer`,
		taken + `:3: consumes[0] "billing.order.shipped": billing does not emit it; it emits order.placed, order.paid, order.refunded, invoice.issued; write one of billing.order.placed`,
		breaking + `:5: seats.mailer.accepts "send": removes or renames accept send of seat mailer, which modules billing, fresh, shop, telegram use`,
		breaking + `:5: seats.mailer.accepts "send-bulk"`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if want := fine + ": ok (module fresh)\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}

	// The catalogue checked against itself: every file is its own previous version.
	files, _ := filepath.Glob(filepath.Join(catalogueDir, "*.yaml"))
	if _, stderr, code := runModule(t, append([]string{"check", "--catalogue", catalogueDir}, files...)...); code != exitOK {
		t.Fatalf("the catalogue fails against itself: exit %d\n%s", code, stderr)
	}
}

func TestModuleCheck_SameModuleTwice(t *testing.T) {
	dir := t.TempDir()
	a := writeManifest(t, dir, "a.yaml", "module: m\n")
	b := writeManifest(t, dir, "b.yaml", "module: m\n")
	_, stderr, code := runModule(t, "check", a, b)
	if code != exitFailed || !strings.Contains(stderr, b+`: module "m": is also declared by `+a) {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
}

func TestModuleCheck_Errors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"no FILE", []string{"check"}, exitUsage, "at least one FILE"},
		{"unknown flag", []string{"check", "--catalog", "x", "a.yaml"}, exitUsage, "unknown flag"},
		{"unknown verb", []string{"lint"}, exitUsage, `unknown module verb "lint"`},
		{"unreadable FILE", []string{"check", missing}, exitFailed, missing + ": cannot read: no such file"},
		{"missing catalogue", []string{"check", "--catalogue", missing, missing}, exitFailed, "catalogue:"},
		{"show without FILE", []string{"show"}, exitUsage, "one FILE"},
		{"show two FILEs", []string{"show", "a", "b"}, exitUsage, "one FILE"},
		{"show unreadable", []string{"show", missing}, exitFailed, "read manifest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runModule(t, tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.says) {
				t.Fatalf("exit %d, want %d; stderr %q, want it to say %q", code, tc.code, stderr, tc.says)
			}
		})
	}

	bad := writeManifest(t, "", "bad.yaml", "module: Bad\n")
	_, stderr, code := runModule(t, "check", "--catalogue", filepath.Dir(bad), writeManifest(t, "", "ok.yaml", "module: ok\n"))
	if code != exitFailed || !strings.Contains(stderr, "catalogue manifest "+bad+" is refused") {
		t.Fatalf("a refused catalogue entry: exit %d\n%s", code, stderr)
	}
}

func TestModuleShow(t *testing.T) {
	path := filepath.Join(catalogueDir, "telegram.yaml")
	stdout, stderr, code := runModule(t, "show", path)
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	for _, want := range []string{
		"mesh.mod.telegram.event.message.received",
		"(durable consumer telegram on EVENTS)",
		"mesh.mod.*.event.download.completed",
		"mesh.mod.telegram.tool.status",
		"publish mesh.seat.mailer.accept.>, mesh.seat.mailer.node.*.accept.>",
		"request mesh.seat.mailer.tool.>",
		"SEAT_telegram-sender: mesh.seat.telegram-sender.accept.>, workqueue, max age 168h0m0s",
		"EVENTS/telegram",
		"max ack pending 32, max deliver 5",
		"$JS.API.CONSUMER.MSG.NEXT.EVENTS.telegram",
		"_INBOX.telegram.>",
		"of seat telegram-sender",
		"$JS.ACK.SEAT_telegram-sender.seat-telegram-sender.>",
		"mesh.seat.telegram-sender.tool.status  (queue group telegram-sender only)",
		"fingerprint",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("show lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(stdout)
	}

	stdout, _, code = runModule(t, "show", filepath.Join(catalogueDir, "builder.yaml"))
	if code != exitOK || !strings.Contains(stdout, "seat-build-machine-<node> on SEAT_build-machine") ||
		!strings.Contains(stdout, "mesh.seat.build-machine.node.<node>.accept.build") {
		t.Fatalf("node-scoped seat not shown for <node>:\n%s", stdout)
	}
}

func TestModuleShow_JSON(t *testing.T) {
	stdout, stderr, code := runModule(t, "show", "--json", filepath.Join(catalogueDir, "telegram.yaml"))
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	var v struct {
		File       string
		Manifest   struct{ Module string }
		Derivation struct {
			Inbox       string `json:"inbox_prefix"`
			Permissions struct {
				Publish   []string
				Subscribe []struct{ Subject, Queue string }
			}
			EventsConsumer struct {
				FilterSubjects []string `json:"filter_subjects"`
			} `json:"events_consumer"`
			Seats []struct {
				Fingerprint string
				Holder      struct{ Publish []string } `json:"holder_permissions"`
			}
		}
	}
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout)
	}
	if dec.More() {
		t.Fatal("more than one JSON object")
	}
	d := v.Derivation
	if v.Manifest.Module != "telegram" || d.Inbox != "_INBOX.telegram" || len(d.Permissions.Publish) == 0 ||
		len(d.EventsConsumer.FilterSubjects) != 4 || len(d.Seats) != 1 || len(d.Seats[0].Fingerprint) != 64 || len(d.Seats[0].Holder.Publish) == 0 {
		t.Fatalf("JSON lacks the derivation:\n%s", stdout)
	}
	if strings.Contains(stdout, `\u003e`) {
		t.Fatal("JSON escapes > in subjects")
	}
}

func TestModuleShow_Refused(t *testing.T) {
	path := writeManifest(t, "", "bad.yaml", "module: m\nemits: [\">\"]\n")
	stdout, stderr, code := runModule(t, "show", path)
	if code != exitFailed || stdout != "" || !strings.Contains(stderr, path+`:2: emits[0] ">"`) {
		t.Fatalf("exit %d, stdout %q, stderr:\n%s", code, stdout, stderr)
	}
}

// TestModuleShow_Builtin: --builtin prints the mesh's own seats with their protocols, derived
// like a module's (the controller's report verb has its work queue); a FILE beside it is a
// usage error.
func TestModuleShow_Builtin(t *testing.T) {
	out, stderr, code := runModule(t, "show", "--builtin")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"seat  mesh-controller", "accepts report", "mesh.seat.mesh-controller.accept.report",
		"SEAT_mesh-controller", "seat  mesh-vault", "seat  mesh-git", "emits pushed", "seat  mesh-build-machine", "accepts build"} {
		if !strings.Contains(out, want) {
			t.Errorf("module show --builtin lacks %q:\n%s", want, out)
		}
	}
	if _, _, code := runModule(t, "show", "--builtin", "extra.yaml"); code != 2 {
		t.Errorf("module show --builtin FILE: exit %d, want 2 (usage)", code)
	}
}

// TestModuleCheck_WaitingInterface: a required interface nobody provides is no refusal, but
// the check says the module will wait for it; one a checked provisioner provides is not.
func TestModuleCheck_WaitingInterface(t *testing.T) {
	dir := t.TempDir()
	app := writeManifest(t, dir, "app.yaml", "module: app\nrequires: [mesh-bus, postgres, redis]\n")
	pg := writeManifest(t, dir, "pg.yaml", "module: pg\nrequires: [mesh-bus]\nseats:\n  postgres: {scope: mesh, serves: [create, remove, holds], provides: [postgres]}\n")
	stdout, stderr, code := runModule(t, "check", app, pg)
	if code != exitOK || !strings.Contains(stdout, "app.yaml: note: requires redis") || strings.Contains(stdout, "requires postgres") {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
}
