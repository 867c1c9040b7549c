package embedbus

import (
	"bytes"
	"log/slog"
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
