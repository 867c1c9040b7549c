package node_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
)

// versionedMailer serves v1 and, beside it, a v2 whose send needs a subject as well.
const versionedMailer = `module: mail
requires: [mesh-bus]
seats:
  mailer:
    scope: mesh
    retain: 1h
    accepts: [send]
    serves: [status]
    emits: [delivered]
    versions:
      v2:
        accepts: [send]
        serves: [status]
        emits: [delivered]
        shapes:
          send: {type: object, required: [to, subject]}
`

// versionsOf returns `seat ls`'s versions of seat as "v1=old v2=new,other" ("-" for none
// bound, "retirable" marked).
func versionsOf(t *testing.T, b *bed, seat string) string {
	t.Helper()
	var parts []string
	for _, v := range seatStatus(t, b, seat).Versions {
		bound := strings.Join(v.Bound, ",")
		if v.Retirable {
			bound = "retirable"
		}
		parts = append(parts, v.Version+"="+bound)
	}
	return strings.Join(parts, " ")
}

// TestProtocol_VersionsBesideEachOther (DESIGN §2, §7): a breaking change is made as v2
// beside v1. One holder serves a v1 caller and a v2 caller, each on its own version's
// subjects, which the bus keeps apart; a consumer pinned to v2 hears v2's events only;
// `seat ls` shows who is bound to which version; after the v1 caller is re-pinned it speaks
// v2, and v1 is reported retirable — so the declarer may now change v1, but not remove v2.
func TestProtocol_VersionsBesideEachOther(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mailSeed, _ := b.register(versionedMailer)
	oldSeed, _ := b.register("module: old\nrequires: [mesh-bus]\nuses: [mailer]\n")
	newSeed, _ := b.register("module: new\nrequires: [mesh-bus]\nuses: [mailer]\n")
	watchSeed, _ := b.register("module: watcher\nrequires: [mesh-bus]\nconsumes: [seat.mailer.delivered]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	pin := func(module, version string) api.PinReply {
		t.Helper()
		reply, err := admin.Pin(ctx, b.op, api.PinRequest{Module: module, Seat: "mailer", Version: version})
		if err != nil {
			t.Fatalf("pin %s to %s: %v", module, version, err)
		}
		return reply
	}
	if _, err := admin.Pin(ctx, b.op, api.PinRequest{Module: "new", Seat: "mailer", Version: "v3"}); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "v1, v2") {
		t.Fatalf("pin to an undeclared version: %v, want a refusal naming v1, v2", err)
	}
	if _, err := admin.Pin(ctx, b.op, api.PinRequest{Module: "mail", Seat: "mailer", Version: "v2"}); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "neither uses") {
		t.Fatalf("pin of a module that does not use the seat: %v", err)
	}
	if r := pin("new", "v2"); r.Previous != "v1" || r.Retirable {
		t.Fatalf("pin new: %+v", r)
	}
	pin("watcher", "v2")
	if got := versionsOf(t, b, "mailer"); got != "v1=old v2=new,watcher" {
		t.Fatalf("seat ls versions %q", got)
	}

	// The holder implements both versions, or it does not claim.
	type job struct{ version, body string }
	jobs := make(chan job, 8)
	handle := func(_ context.Context, j sdk.Job) error { jobs <- job{j.Version, string(j.Data)}; return nil }
	status := func(v string) sdk.ToolHandler {
		return func(context.Context, sdk.Request) ([]byte, error) { return []byte(`"` + v + `"`), nil }
	}
	v1 := sdk.SeatHandlers{Accepts: map[string]sdk.JobHandler{"send": handle}, Serves: map[string]sdk.ToolHandler{"status": status("v1")}}
	h := b.client(mailSeed)
	if err := h.HoldSeat("mailer", v1); !errors.Is(err, sdk.ErrIncomplete) || !strings.Contains(err.Error(), "v2 accepts send") {
		t.Fatalf("HoldSeat with v1's handlers only: %v, want ErrIncomplete naming v2's", err)
	}
	v1.Versions = map[string]sdk.SeatHandlers{"v2": {Accepts: map[string]sdk.JobHandler{"send": handle}, Serves: map[string]sdk.ToolHandler{"status": status("v2")}}}
	if err := h.HoldSeat("mailer", v1); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		if held, _ := h.Holding("mailer"); !held {
			return errors.New("no holder yet")
		}
		return nil
	})

	oldC, newC := b.client(oldSeed), b.client(newSeed, sdk.WithShapeChecks())
	if _, err := oldC.Submit(ctx, "mailer", "send", `{"to":"a"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := newC.Submit(ctx, "mailer", "send", `{"to":"b"}`); !errors.Is(err, sdk.ErrShape) {
		t.Fatalf("a v2 job without v2's required subject: %v, want ErrShape", err)
	}
	if _, err := newC.Submit(ctx, "mailer", "send", `{"to":"b","subject":"hi"}`); err != nil {
		t.Fatal(err)
	}
	got := map[job]bool{}
	for len(got) < 2 {
		select {
		case j := <-jobs:
			got[j] = true
		case <-ctx.Done():
			t.Fatalf("jobs %v: the holder did not get both callers' work", got)
		}
	}
	if want := (map[job]bool{{"", `{"to":"a"}`}: true, {"v2", `{"to":"b","subject":"hi"}`}: true}); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("jobs %v, want %v", got, want)
	}
	for c, want := range map[*sdk.Client]string{oldC: `"v1"`, newC: `"v2"`} {
		var reply []byte
		retryUntil(t, 5*time.Second, func() (err error) {
			reply, err = c.Call(ctx, "mailer", "status", nil)
			return err
		})
		if string(reply) != want {
			t.Fatalf("%s's status: %s, want %s", c.Module(), reply, want)
		}
	}
	// The bus keeps each caller to its version.
	if !refusedPub(t, b.raw(oldSeed, "old"), manifest.SeatAcceptSubjectAt("mailer", "v2", "send")) {
		t.Fatal("the bus let the v1 caller send v2 work")
	}
	if !refusedPub(t, b.raw(newSeed, "new"), manifest.SeatAcceptSubject("mailer", "send")) {
		t.Fatal("the bus let the v2 caller send v1 work")
	}

	// Events: the v2 consumer hears the holder's v2 event, not its v1 one, under the seat's name.
	events := make(chan string, 8)
	w := b.client(watchSeed)
	if err := w.On("seat.mailer.delivered", func(_ context.Context, e sdk.Event) error {
		events <- e.Key + " " + e.Source + " " + string(e.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.EmitSeat(ctx, "mailer", "delivered", "in v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.EmitSeatAt(ctx, "mailer", "v2", "delivered", "in v2"); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-events:
		if e != "seat.mailer.delivered mailer in v2" {
			t.Fatalf("the v2 consumer heard %q, want v2's event under the seat's name", e)
		}
	case <-ctx.Done():
		t.Fatal("the v2 consumer never heard the v2 event")
	}

	// Re-pinning the v1 caller leaves v1 retirable; the caller comes back speaking v2.
	if r := pin("old", "v2"); r.Previous != "v1" || !r.Retirable {
		t.Fatalf("pin old: %+v, want v1 retirable", r)
	}
	if got := versionsOf(t, b, "mailer"); got != "v1=retirable v2=new,old,watcher" {
		t.Fatalf("seat ls versions after the re-pin %q", got)
	}
	retryUntil(t, 15*time.Second, func() error {
		_, err := oldC.Submit(ctx, "mailer", "send", `{"to":"c","subject":"moved"}`)
		return err
	})
	for {
		select {
		case j := <-jobs:
			if j.body == `{"to":"c","subject":"moved"}` {
				if j.version != "v2" {
					t.Fatalf("the re-pinned caller's job came in %q, want v2", j.version)
				}
				goto moved
			}
		case <-ctx.Done():
			t.Fatal("the re-pinned caller's job never reached the holder")
		}
	}
moved:
	// Nobody is bound to v1: the declarer may change it. v2 is bound: it may not go.
	v1Changed := strings.Replace(versionedMailer, "    accepts: [send]\n    serves", "    accepts: [post]\n    serves", 1)
	if _, err := admin.Register(ctx, b.op, []byte(v1Changed)); err != nil {
		t.Fatalf("changing retirable v1: %v", err)
	}
	withoutV2 := v1Changed[:strings.Index(v1Changed, "    versions:")]
	_, err := admin.Register(ctx, b.op, []byte(withoutV2))
	if !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "removes protocol version v2") || !strings.Contains(err.Error(), "new, old, watcher") {
		t.Fatalf("removing bound v2: %v, want a refusal naming new, old, watcher", err)
	}
	// The audit log takes the v2 event as the seat's, signed by its holder.
	b.waitAudited(10 * time.Second)
	if recs := b.auditAll("mailer"); !slices.ContainsFunc(recs, func(r api.AuditRecord) bool {
		return r.Subject == manifest.SeatEventSubjectAt("mailer", "v2", "delivered") && r.Signed && r.SourceMatches
	}) {
		t.Fatalf("no signed, matching audit record of the v2 event among %d", len(recs))
	}
}
