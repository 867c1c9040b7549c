package envelope_test

import (
	"errors"
	"testing"
	"time"

	"github.com/meshnode/meshnode/manifest"

	"github.com/meshnode/meshnode/envelope"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

func TestStampVerifyRead(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	subject, body := "mesh.mod.billing.event.order.placed", []byte(`{"id":1}`)
	h, err := envelope.Stamp(kp, "billing", "alpha", subject, body, envelope.Options{Causation: "c1", Schema: "order/v1"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Get(nats.MsgIdHdr) != h.Get(envelope.EventID) || len(h.Get(envelope.EventID)) != 36 {
		t.Fatalf("Nats-Msg-Id %q vs x-event-id %q", h.Get(nats.MsgIdHdr), h.Get(envelope.EventID))
	}
	if err := envelope.Verify(h, subject, body, pub); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if err := envelope.Verify(h, subject, []byte(`{"id":2}`), pub); !errors.Is(err, envelope.ErrBadSignature) {
		t.Fatalf("Verify of a changed body: %v, want ErrBadSignature", err)
	}
	if err := envelope.Verify(h, "mesh.mod.shop.event.order.placed", body, pub); !errors.Is(err, envelope.ErrBadSignature) {
		t.Fatalf("Verify on another subject: %v, want ErrBadSignature", err)
	}
	other, _ := nkeys.CreateUser()
	otherPub, _ := other.PublicKey()
	if err := envelope.Verify(h, subject, body, otherPub); !errors.Is(err, envelope.ErrBadSignature) {
		t.Fatalf("Verify with another key: %v, want ErrBadSignature", err)
	}

	h.Set("x-foo", "kept")
	e, err := envelope.Read(subject, h, body)
	if err != nil {
		t.Fatal(err)
	}
	if e.Key != "billing.order.placed" || e.Source != "billing" || e.Node != "alpha" || e.Causation != "c1" || e.Schema != "order/v1" || e.Time.IsZero() {
		t.Fatalf("Read=%+v", e)
	}
	if e.Header.Get("x-foo") != "kept" {
		t.Fatal("unknown header dropped")
	}
	h.Del(envelope.Source)
	if _, err := envelope.Read(subject, h, body); !errors.Is(err, envelope.ErrMissingHeader) {
		t.Fatalf("Read without x-source: %v", err)
	}
}

func TestNewSigningKey_SignsAsTheNkey(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	k, err := envelope.NewSigningKey(kp)
	if err != nil {
		t.Fatal(err)
	}
	subject := "mesh.mod.a.event.x"
	h, err := envelope.Stamp(k, "a", "n", subject, []byte("{}"), envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := envelope.Verify(h, subject, []byte("{}"), pub); err != nil {
		t.Fatalf("a signature by the expanded key does not verify against the nkey: %v", err)
	}
}

func BenchmarkStamp(b *testing.B) {
	kp, _ := nkeys.CreateUser()
	k, _ := envelope.NewSigningKey(kp)
	body := make([]byte, 256)
	for _, tc := range []struct {
		name string
		s    envelope.Signer
	}{{"nkeys", kp}, {"expanded", k}} {
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				envelope.Stamp(tc.s, "a", "n", "mesh.mod.a.event.x", body, envelope.Options{})
			}
		})
	}
}

func TestKey(t *testing.T) {
	for subject, want := range map[string]string{
		"mesh.mod.billing.event.order.placed": "billing.order.placed",
		"mesh.seat.mailer.event.delivered":    "seat.mailer.delivered",
		"mesh.node.alpha.event.joined":        "node.alpha.joined",
		"mesh.mod.billing.tool.status":        "mesh.mod.billing.tool.status",
	} {
		if got := envelope.Key(subject); got != want {
			t.Errorf("Key(%q)=%q, want %q", subject, got, want)
		}
	}
}

// TestKey_IsAPattern: every name Key prints is an event pattern (manifest.EventPattern, what
// `audit query --event` and `listen` take) matching the subject it names, and no other of
// these — a module and a node of one name included.
func TestKey_IsAPattern(t *testing.T) {
	subjects := []string{
		"mesh.mod.billing.event.order.placed", "mesh.mod.alpha.event.joined", "mesh.seat.mailer.event.delivered",
		"mesh.seat.mailer.v2.event.delivered", "mesh.seat.mesh-controller.event.provisioned",
		"mesh.node.alpha.event.joined", "mesh.node.alpha.event.member-unreachable", "mesh.node.c.event.flood-barred",
	}
	for _, subject := range subjects {
		key := envelope.Key(subject)
		pattern, err := manifest.EventPattern(key)
		if err != nil {
			t.Errorf("%s prints as %q, which is not a pattern: %v", subject, key, err)
			continue
		}
		for _, other := range subjects {
			same := envelope.Key(other) == key // a versioned seat event is named as its first version
			if got := manifest.Matches(pattern, envelope.Unversioned(other)); got != same {
				t.Errorf("pattern %q (%s, from %s) matches %s: %v", key, pattern, subject, other, got)
			}
		}
	}
	for pattern, want := range map[string]string{
		"node.**": "mesh.node.*.event.>", "node.alpha.**": "mesh.node.alpha.event.>",
		"node.*.member-unreachable": "mesh.node.*.event.member-unreachable", "seat.mailer.*": "mesh.seat.mailer.event.*",
	} {
		if got, err := manifest.EventPattern(pattern); err != nil || got != want {
			t.Errorf("EventPattern(%q) = %q, %v; want %q", pattern, got, err, want)
		}
	}
	for _, bad := range []string{"node.alpha", "node.seat.x.y", "node.*"} {
		if got, err := manifest.EventPattern(bad); err == nil {
			t.Errorf("EventPattern(%q) = %q, want an error saying how to write it", bad, got)
		}
	}
}

// TestNewIDAt: an id made for a time holds that time to the millisecond and is a UUIDv7.
func TestNewIDAt(t *testing.T) {
	at := time.Date(2031, 3, 4, 5, 6, 7, 891_234_567, time.UTC)
	id, err := envelope.NewIDAt(at)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := envelope.ParseID(id.String()); err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	if got := envelope.IDTime(id); !got.Equal(at.Truncate(time.Millisecond)) {
		t.Fatalf("IDTime = %s, want %s", got, at.Truncate(time.Millisecond))
	}
}
