package sdk

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
)

func TestMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"mesh.mod.a.event.x", "mesh.mod.a.event.x", true},
		{"mesh.mod.*.event.x", "mesh.mod.b.event.x", true},
		{"mesh.mod.*.event.x", "mesh.mod.b.event.x.y", false},
		{"mesh.mod.a.event.>", "mesh.mod.a.event.x.y", true},
		{"mesh.mod.a.event.>", "mesh.mod.a.event", false},
		{"mesh.*.*.event.>", "mesh.seat.s.event.done", true},
		{"mesh.*.*.event.>", "mesh.mod.a.tool.status", false},
	} {
		if got := manifest.Matches(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("Matches(%q, %q)=%v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
}

func TestSubjectCovers(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"mesh.*.*.event.>", "mesh.mod.a.event.x", true},
		{"mesh.*.*.event.>", "mesh.mod.*.event.>", true},
		{"mesh.mod.a.event.>", "mesh.mod.*.event.x", false},
		{"mesh.mod.*.event.x", "mesh.mod.a.event.x", true},
		{"mesh.mod.a.event.x", "mesh.mod.a.event.x", true},
		{"mesh.mod.a.event.x", "mesh.mod.a.event.y", false},
		{"mesh.mod.a.event.x", "mesh.mod.a.event.>", false},
	} {
		if got := subjectCovers(tc.a, tc.b); got != tc.want {
			t.Errorf("subjectCovers(%q, %q)=%v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestClient_EmitSubject: an event named with its own module's name in front is refused
// saying to drop it, not to declare it (which would declare another event).
func TestClient_EmitSubject(t *testing.T) {
	c := &Client{self: api.WhoamiReply{Module: "shop", Emits: []string{"order.placed"}}}
	if got, err := c.emitSubject("order.placed"); err != nil || got != manifest.EventSubject("shop", "order.placed") {
		t.Fatalf("emitSubject(order.placed)=%q, %v", got, err)
	}
	for event, says := range map[string]string{
		"shop.order.placed": `write "order.placed"`,
		"order.cancelled":   `does not emit "order.cancelled" (it emits [order.placed]); add it to emits:`,
	} {
		_, err := c.emitSubject(event)
		if !errors.Is(err, ErrNotDeclared) || !strings.Contains(err.Error(), says) {
			t.Errorf("emitSubject(%q): %v, want ErrNotDeclared saying %q", event, err, says)
		}
	}
}

// TestServes: a tool the seat does not serve is refused naming the version; a caller is told
// it is the one it is pinned to (v2 may serve less than the manifest's v1 shows), a holder
// is not (it is not pinned).
func TestServes(t *testing.T) {
	if err := callable(api.SeatInfo{Seat: "mailer", Serves: []string{"status"}}, "status"); err != nil {
		t.Fatal(err)
	}
	v1, v2 := api.SeatInfo{Seat: "mailer", Serves: []string{"status"}}, api.SeatInfo{Seat: "mailer", Version: "v2", Serves: []string{}}
	for _, tc := range []struct {
		check     func(api.SeatInfo, string) error
		info      api.SeatInfo
		says, not string
	}{
		{callable, v1, `seat mailer serves [status], not "queue"`, "pinned"},
		{callable, v2, `seat mailer's v2 serves [], not "queue" (the version this module is pinned to;`, "never said"},
		{serves, v2, `seat mailer's v2 serves [], not "queue"`, "pinned"},
	} {
		err := tc.check(tc.info, "queue")
		if !errors.Is(err, ErrNotDeclared) || !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), tc.not) {
			t.Errorf("%+v, queue: %v, want it to say %q and not %q", tc.info, err, tc.says, tc.not)
		}
	}
}
