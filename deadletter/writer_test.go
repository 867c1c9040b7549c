package deadletter

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// advisory is the JSON of an advisory of type typ.
func advisory(t *testing.T, typ, stream, consumer string, seq uint64, reason string) []byte {
	t.Helper()
	b, err := json.Marshal(server.JSConsumerDeliveryTerminatedAdvisory{TypedEvent: server.TypedEvent{Type: typ},
		Stream: stream, Consumer: consumer, StreamSeq: seq, Deliveries: 3, Reason: reason})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReadAdvisory: an advisory is a client's word (a +TERM's reason, its sequence): only the
// mesh's consumed streams, one literal consumer token and a real sequence are taken, and the
// reason becomes one bounded, printable header value.
func TestReadAdvisory(t *testing.T) {
	d, err := readAdvisory(advisory(t, server.JSConsumerDeliveryExceededAdvisoryType, manifest.EventsStreamName, "sink", 7, ""))
	if want := (death{stream: manifest.EventsStreamName, consumer: "sink", seq: 7, deliveries: 3, reason: reasonMaxDeliveries}); err != nil || d != want {
		t.Fatalf("max deliveries: %+v %v, want %+v", d, err, want)
	}
	d, err = readAdvisory(advisory(t, server.JSConsumerDeliveryTerminatedAdvisoryType, manifest.SeatStreamName("mailer"), "mailer", 2, ""))
	if err != nil || !d.terminated || d.reason != reasonTerminated || !d.workQueue() {
		t.Fatalf("a seat's job terminated without a reason: %+v %v", d, err)
	}
	long := "line one\nline\ttwo\x00" + strings.Repeat("é", maxDeadReason)
	d, err = readAdvisory(advisory(t, server.JSConsumerDeliveryTerminatedAdvisoryType, manifest.EventsStreamName, "sink", 1, long))
	if err != nil || strings.ContainsAny(d.reason, "\n\t\x00") || len(d.reason) > maxDeadReason || !strings.HasPrefix(d.reason, "line one line two") {
		t.Fatalf("reason %q (%d bytes) %v", d.reason, len(d.reason), err)
	}
	for name, data := range map[string][]byte{
		"not JSON":          []byte("{"),
		"another type":      advisory(t, "io.nats.jetstream.advisory.v1.api_audit", manifest.EventsStreamName, "sink", 1, ""),
		"another stream":    advisory(t, server.JSConsumerDeliveryExceededAdvisoryType, "DEAD", "sink", 1, ""),
		"a bad seat stream": advisory(t, server.JSConsumerDeliveryExceededAdvisoryType, manifest.SeatStreamName("Bad.Seat"), "sink", 1, ""),
		"a wildcard":        advisory(t, server.JSConsumerDeliveryExceededAdvisoryType, manifest.EventsStreamName, "*", 1, ""),
		"two tokens":        advisory(t, server.JSConsumerDeliveryExceededAdvisoryType, manifest.EventsStreamName, "a.b", 1, ""),
		"sequence zero":     advisory(t, server.JSConsumerDeliveryExceededAdvisoryType, manifest.EventsStreamName, "sink", 0, ""),
	} {
		if d, err := readAdvisory(data); err == nil {
			t.Errorf("%s: taken as %+v", name, d)
		}
	}
}

// TestDeadHeaders: a letter keeps the original's headers but none the broker acts on or that
// passes for the writer's own, and its id is fixed by the death.
func TestDeadHeaders(t *testing.T) {
	orig := nats.Header{"X-Source": {"billing"}, "Nats-Msg-Id": {"forged"}, "Nats-Expected-Stream": {"DEAD"}, envelope.DeadReason: {"forged"}}
	dd := death{stream: manifest.EventsStreamName, consumer: "sink", seq: 9, deliveries: 4, reason: "boom"}
	h := deadHeaders(orig, dd, "mesh.mod.billing.event.x")
	if got := h.Get("X-Source"); got != "billing" {
		t.Errorf("x-source %q, want the original's", got)
	}
	if got := h.Get("Nats-Expected-Stream"); got != "" {
		t.Errorf("Nats-Expected-Stream %q kept", got)
	}
	for k, want := range map[string]string{nats.MsgIdHdr: "dead.EVENTS.sink.9", envelope.DeadReason: "boom", envelope.DeadDeliveries: "4",
		envelope.DeadSubject: "mesh.mod.billing.event.x", envelope.DeadConsumer: "sink", envelope.DeadStream: manifest.EventsStreamName} {
		if got := h.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("%s %q, want %q", k, got, want)
		}
	}
}
