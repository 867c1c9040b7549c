package embedbus

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLogger_RedactsPasswords: a route's URL, as nats-server prints it when it removes one,
// reaches the log without the mesh's route credential.
func TestLogger_RedactsPasswords(t *testing.T) {
	got := redact("Removed route %v", []any{"nats-route://route:s3cr3t-Pa55@127.0.0.1:6222"})
	if strings.Contains(got, "s3cr3t") || !strings.Contains(got, "nats-route://route:REDACTED@127.0.0.1:6222") {
		t.Fatalf("logged %q", got)
	}
	if got := redact("Listening for route connections on %s:%d", []any{"0.0.0.0", 6222}); got != "Listening for route connections on 0.0.0.0:6222" {
		t.Fatalf("logged %q", got)
	}
}

// TestLogger_BannerAtDebug: nats-server's start banner goes to debug; what matters to an
// operator (a route's error, a leader change) stays at info and above.
func TestLogger_BannerAtDebug(t *testing.T) {
	var buf bytes.Buffer
	l := &logger{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	for _, line := range []string{"Starting nats-server", "  Version:  2.15.2", "", "    _ ___ _____ ___ _____ ___ ___   _   __  __",
		"---------------- JETSTREAM ----------------", "Took 5.2ms to start JetStream", "Listening for client connections on 127.0.0.1:4222", "Server is ready"} {
		l.Noticef("%s", line)
	}
	if buf.Len() != 0 {
		t.Fatalf("the banner was logged at info:\n%s", buf.String())
	}
	l.Noticef("JetStream cluster new metadata leader: %s", "b")
	if !strings.Contains(buf.String(), "new metadata leader: b") {
		t.Fatalf("a leader change was not logged at info: %q", buf.String())
	}
}

// TestLogger_DampsFloods: a flood of denied publishes or refused connects is logged once a
// second per kind, the next line counting those left out; other errors are all logged.
func TestLogger_DampsFloods(t *testing.T) {
	var buf bytes.Buffer
	l := &logger{log: slog.New(slog.NewTextHandler(&buf, nil))}
	for range 1000 {
		l.Errorf("%s - cid:%d - %q - Publish Violation - Subject %q", "127.0.0.1:1", 5, "$G/nkey:UX", "mesh.seat.mesh-controller.accept.report")
		l.Errorf("%s - cid:%d - authentication error - Nkey %q", "127.0.0.1:2", 6, "UX")
	}
	l.Errorf("a route failed: %s", "x")
	l.Errorf("a route failed: %s", "y")
	if got := strings.Count(buf.String(), "\n"); got != 4 {
		t.Fatalf("%d lines logged, want one per kind of flood and both others:\n%s", got, buf.String())
	}
	l.damp.last[floodClass(" - Publish Violation - ")] = l.damp.last[floodClass(" - Publish Violation - ")].Add(-time.Second)
	buf.Reset()
	l.Errorf("%s - Publish Violation - Subject %q", "127.0.0.1:1 - cid:5", "x")
	if !strings.Contains(buf.String(), "suppressed=999") {
		t.Fatalf("the next line a second later: %q, want it to count the 999 left out", buf.String())
	}
}

// TestLogger_DeniedFlood: a connection's denied publishes are counted from the format
// nats-server logs them with, and told once a window past DeniedFlood; another connection's
// are counted apart.
func TestLogger_DeniedFlood(t *testing.T) {
	var told []uint64
	l := &logger{log: slog.New(slog.DiscardHandler), onDenied: func(cid uint64, n int) {
		if n <= DeniedFlood {
			t.Errorf("told at %d denials, want past %d", n, DeniedFlood)
		}
		told = append(told, cid)
	}}
	for range 3 * DeniedFlood {
		l.Errorf(`127.0.0.1:5000 - cid:17 - "attacker" - Publish Violation - Subject %q`, "x.y")
	}
	for range DeniedFlood {
		l.Errorf(`127.0.0.1:5001 - cid:18 - Publish Violation - Subject %q`, "x.y")
	}
	if len(told) != 1 || told[0] != 17 {
		t.Fatalf("told of %v, want connection 17 once", told)
	}
	if cid, ok := clientID(`[::1]:1 - cid:4021 - Publish Violation`); !ok || cid != 4021 {
		t.Fatalf("clientID = %d, %v", cid, ok)
	}
	if _, ok := clientID(`rid:3 - Publish Violation`); ok {
		t.Fatal("a route's line read as a client's")
	}
}

// deadPeerError is the error a dial of a closed port gives, as nats-server's route dial
// logs it.
func deadPeerError(t *testing.T) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
		t.Fatalf("dialled %s after closing its listener", addr)
	}
	return err
}

// TestLogger_SummarisesRepeats: a dead peer's route dials, retried every second on each
// pooled connection, are logged once, then at most once a minute per peer with a count of
// those left out, which go to debug level; a route's or a client's repeated line is grouped
// by its remote host (its port changes at each reconnect) and what it says.
func TestLogger_SummarisesRepeats(t *testing.T) {
	var buf, debug bytes.Buffer
	l := &logger{log: slog.New(slog.NewTextHandler(&buf, nil))}
	ld := &logger{log: slog.New(slog.NewTextHandler(&debug, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	deadA, deadB := deadPeerError(t), deadPeerError(t)
	for attempt := 1; attempt <= 10; attempt++ {
		for range 4 { // the route pool's connections and the pinned accounts' each retry
			for _, l := range []*logger{l, ld} {
				l.Errorf(routeConnectError, attempt, deadA)
				l.Errorf(routeConnectError, attempt, deadB)
			}
		}
	}
	if got := strings.Count(debug.String(), "(attempt 10)"); got != 8 {
		t.Fatalf("%d of the 10th attempts at debug level, want all 8:\n%s", got, debug.String())
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], deadA.Error()) || !strings.Contains(lines[1], deadB.Error()) {
		t.Fatalf("logged:\n%s\nwant the first dial of each peer", buf.String())
	}
	for _, line := range lines {
		if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "(attempt 1)") {
			t.Fatalf("logged %q, want the first attempt at error", line)
		}
	}

	buf.Reset()
	for k, at := range l.repeats.last {
		l.repeats.last[k] = at.Add(-time.Minute)
	}
	l.Errorf(routeConnectError, 11, deadA)
	l.Errorf(routeConnectError, 11, deadA)
	if got := buf.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "(attempt 11)") || !strings.Contains(got, "suppressed=39") {
		t.Fatalf("a minute later: %q, want one line counting the 39 left out", got)
	}

	buf.Reset()
	l.Errorf("127.0.0.1:6222 - rid:7 - TLS route handshake error: %v", "tls: bad certificate")
	l.Errorf("127.0.0.1:6222 - rid:9 - TLS route handshake error: %v", "tls: bad certificate")
	l.Warnf(`127.0.0.1:50001 - cid:12 - "v1.55.0:go:billing - 1" - "$G/nkey:UXX" - Readloop processing time: %v`, time.Second)
	l.Warnf(`127.0.0.1:50002 - cid:13 - "v1.55.0:go:billing - 2" - "$G/nkey:UXX" - Readloop processing time: %v`, time.Second)
	l.Warnf(`10.0.0.9:50003 - cid:14 - "v1.55.0:go:billing" - Readloop processing time: %v`, time.Second)
	l.Errorf("a route failed: %s", "x")
	l.Errorf("a route failed: %s", "x")
	if got := strings.Count(buf.String(), "\n"); got != 5 {
		t.Fatalf("%d lines logged, want one per route host, one per client host, and both others:\n%s", got, buf.String())
	}
}

// TestLogger_ViolationNamesModule: a permission violation is the client's mistake, logged
// at warning level with the module and key of the connection nats-server's line names by
// id; a connection that has closed since is logged as nats-server wrote it.
func TestLogger_ViolationNamesModule(t *testing.T) {
	var buf bytes.Buffer
	l := &logger{log: slog.New(slog.NewTextHandler(&buf, nil)),
		keyOf: func(cid uint64) (string, bool) {
			return map[uint64]string{17: "UBILLING", 18: "UOPERATOR"}[cid], cid == 17 || cid == 18
		},
		moduleOf: func(key string) (string, bool) { return "billing", key == "UBILLING" },
	}
	// The lines as nats-server writes them: the client's prefix (client.go initClient and
	// its CONNECT's name and account/user) in the format, then pubPermissionViolation's and
	// subPermissionViolation's text.
	l.Errorf(`127.0.0.1:50001 - cid:17 - "v1.55.0:go:billing" - "$G/nkey:UBILLING" - Publish Violation - Subject %q`, "mesh.mod.other.tool.x")
	l.Errorf(`127.0.0.1:50001 - cid:17 - "v1.55.0:go:billing" - "$G/nkey:UBILLING" - Subscription Violation - Subject "_INBOX.other.>", SID 4`)
	l.damp = damper{} // the next lines, within the second, would be damped
	l.Errorf(`127.0.0.1:50002 - cid:18 - "$G/nkey:UOPERATOR" - Publish Violation - Subject %q`, "x")
	l.damp = damper{}
	l.Errorf(`127.0.0.1:50003 - cid:19 - Publish Violation - Subject %q`, "x")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("logged:\n%s\nwant 4 lines", buf.String())
	}
	for i, want := range []string{"module=billing key=UBILLING", "module=billing key=UBILLING", "key=UOPERATOR", "Publish Violation"} {
		if !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], want) {
			t.Errorf("line %d: %q, want a warning with %q", i, lines[i], want)
		}
	}
	if strings.Contains(lines[2], "module=") || strings.Contains(lines[3], "key=") {
		t.Errorf("named what it does not know: %q, %q", lines[2], lines[3])
	}
}

// TestLogger_FormatsAreNatsServers: the formats the logger reads are those of the
// nats-server this module builds with, read from its source: a change upstream fails here,
// not silently in an operator's log.
func TestLogger_FormatsAreNatsServers(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/nats-io/nats-server/v2").Output()
	if err != nil {
		t.Fatalf("go list nats-server: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "server")
	read := func(name string) string {
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("read nats-server's source: %v", err)
		}
		return string(src)
	}
	route, client := read("route.go"), read("client.go")
	for _, c := range []struct{ src, want string }{
		{route, strconv.Quote(routeConnectError)},
		{client, `c.ncs.Store(fmt.Sprintf("%s - cid:%d", conn, c.cid))`},
		{client, `c.ncs.Store(fmt.Sprintf("%s - rid:%d", conn, c.cid))`},
		{client, `c.ncs.Store(fmt.Sprintf("%s - %q - %q", c, ncs, acs))`},
		{client, `c.Errorf("Publish Violation - Subject %q", subject)`},
		{client, `"Subscription Violation - Subject %q, SID %s"`},
		{client, `return fmt.Sprintf("%s - %s", s, format)`}, // a client's prefix goes in the format
	} {
		if !strings.Contains(c.src, c.want) {
			t.Errorf("nats-server's source no longer holds %s", c.want)
		}
	}
}
