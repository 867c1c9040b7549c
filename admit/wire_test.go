package admit

import (
	"testing"

	"github.com/meshnode/meshnode/envelope"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// TestHeaderValue: the envelope's id is read from a header block as sent, and a block nats.go
// could not decode is not well formed.
func TestHeaderValue(t *testing.T) {
	for _, c := range []struct {
		block, value string
		ok           bool
	}{
		{"NATS/1.0\r\nx-event-id: abc\r\nx-source: a\r\n\r\n", "abc", true},
		{"NATS/1.0\r\nx-source: a\r\nx-event-id:  abc \r\nx-event-id: second\r\n\r\n", "abc", true},
		{"NATS/1.0 503\r\nx-event-id: abc\r\n\r\n", "abc", true},
		{"NATS/1.0\r\nx-source: a\r\n\r\n", "", true},
		{"NATS/1.0\r\nx-evil: a\nno colon on this line\r\nx-event-id: abc\r\n\r\n", "", false},
		{"NATS/1.0\r\nno colon\r\n\r\n", "", false},
		{"NATS/1.0\r\n: no name\r\n\r\n", "", false},
		{"NATS/1.0\r\nx-event-id: abc\r\n", "", false},         // no end
		{"NATS/1.0\r\nx-event-id: abc\r\n\r\nmore", "", false}, // past the end
		{"HTTP/1.1\r\nx-event-id: abc\r\n\r\n", "", false},
		{"", "", false},
	} {
		v, ok := headerValue([]byte(c.block), envelope.EventID)
		if string(v) != c.value || ok != c.ok {
			t.Errorf("headerValue(%q) = %q, %v; want %q, %v", c.block, v, ok, c.value, c.ok)
		}
	}
}

// TestStoredSize: what the admitter counts from the header block as sent is what the audit
// log counts from the headers nats.go decodes — for an event the sdk stamps.
func TestStoredSize(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	key, _ := envelope.NewSigningKey(kp)
	subject := "mesh.mod.a.event.order.placed"
	body := []byte(`{"order":1}`)
	h, err := envelope.Stamp(key, "a", "alpha", subject, body, envelope.Options{Causation: "0190"})
	if err != nil {
		t.Fatal(err)
	}
	h.Set(nats.MsgIdHdr, h.Get(envelope.EventID))
	block, err := headerBlock(h)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := storedSize(subject, msg{hdr: block, data: body}), envelope.StoredSize(subject, h, body); got != want {
		t.Fatalf("the admitter counts %d bytes, the audit log %d", got, want)
	}
}

// headerBlock is h as nats.go writes it (Msg.headerBytes).
func headerBlock(h nats.Header) ([]byte, error) {
	b := []byte("NATS/1.0\r\n")
	for k, vs := range h {
		for _, v := range vs {
			b = append(b, k+": "+v+"\r\n"...)
		}
	}
	return append(b, "\r\n"...), nil
}
