package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
)

// violation is a permissions violation as nats.go hands it to an error handler: the server's
// -ERR text, unquoted, wrapped around nats.ErrPermissionViolation.
func violation(text string) error {
	return fmt.Errorf("%w: %s", nats.ErrPermissionViolation, text)
}

func TestAsRefusal(t *testing.T) {
	for _, tc := range []struct {
		err         error
		op, subject string
	}{
		{violation(`Permissions Violation for Publish to "mesh.seat.mesh-controller.tool.list"`), sdk.RefusedPublish, "mesh.seat.mesh-controller.tool.list"},
		{violation(`Permissions Violation for Subscription to "_INBOX.x.*"`), sdk.RefusedSubscribe, "_INBOX.x.*"},
		{violation(`Permissions Violation for Subscription to "mesh.mod.a.tool.t" using queue "a"`), sdk.RefusedSubscribe, "mesh.mod.a.tool.t"},
		{violation(`Permissions Violation for Publish with Reply of "mesh.mod.b.event.x"`), sdk.RefusedReply, "mesh.mod.b.event.x"},
		{violation(`Permissions Violation for Publish to "$JS.API.STREAM.INFO.DEAD"`), sdk.RefusedPublish, "$JS.API.STREAM.INFO.DEAD"},
	} {
		r := sdk.AsRefusal(tc.err)
		if r == nil {
			t.Fatalf("AsRefusal(%v)=nil", tc.err)
		}
		if r.Op != tc.op || r.Subject != tc.subject {
			t.Errorf("AsRefusal(%v)=%q %q, want %q %q", tc.err, r.Op, r.Subject, tc.op, tc.subject)
		}
		if !errors.Is(r, sdk.ErrPermission) || !errors.Is(r, nats.ErrPermissionViolation) {
			t.Errorf("%v is not both ErrPermission and nats.ErrPermissionViolation", r)
		}
	}
	for _, err := range []error{nil, io.EOF, nats.ErrAuthorization, errors.New(`Permissions Violation for Publish to "x"`)} {
		if r := sdk.AsRefusal(err); r != nil {
			t.Errorf("AsRefusal(%v)=%v, want nil: only nats.ErrPermissionViolation is a refusal", err, r)
		}
	}
	// A violation the server did not quote a subject in still refuses, without one.
	if r := sdk.AsRefusal(violation("Permissions Violation")); r == nil || r.Subject == "" {
		t.Errorf("AsRefusal without a subject: %+v", r)
	}
}

func TestRefusals_Watch(t *testing.T) {
	rs := sdk.NewRefusals("_INBOX.shop")
	watched := func(subject string) (context.Context, context.CancelFunc) {
		return rs.Watch(context.Background(), subject)
	}
	list, stopList := watched("mesh.seat.mesh-controller.tool.list")
	defer stopList()
	other, stopOther := watched("mesh.mod.shop.event.x")
	defer stopOther()
	all, stopAll := watched("")
	defer stopAll()

	if rs.Handle(io.EOF) {
		t.Fatal("Handle(io.EOF) reported a refusal")
	}
	if !rs.Handle(violation(`Permissions Violation for Publish to "mesh.seat.mesh-controller.tool.list"`)) {
		t.Fatal("Handle did not take a permissions violation")
	}
	for name, ctx := range map[string]context.Context{"the refused subject": list, "any subject": all} {
		r := sdk.Refused(ctx)
		if ctx.Err() == nil || r == nil || r.Subject != "mesh.seat.mesh-controller.tool.list" {
			t.Errorf("a watch of %s: ctx %v, refusal %v; want it ended by the refusal", name, ctx.Err(), r)
		}
	}
	if other.Err() != nil || sdk.Refused(other) != nil {
		t.Fatalf("a watch of another subject ended: %v", context.Cause(other))
	}
	// A refused reply into the connection's inbox ends every request: none can be answered.
	rs.Handle(violation(`Permissions Violation for Subscription to "_INBOX.shop.abc.*"`))
	if r := sdk.Refused(other); r == nil || r.Op != sdk.RefusedSubscribe {
		t.Fatalf("a refused inbox left a request waiting: %v", context.Cause(other))
	}

	// A watch that ends without a refusal has none.
	done, stop := watched("mesh.mod.shop.event.y")
	stop()
	if done.Err() == nil || sdk.Refused(done) != nil {
		t.Fatalf("a stopped watch: ctx %v, refusal %v", done.Err(), sdk.Refused(done))
	}
}
