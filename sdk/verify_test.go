package sdk

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// delivery is a message as a consumer receives it; only what the checks read is real.
type delivery struct {
	jetstream.Msg
	subject string
	header  nats.Header
	data    []byte
}

func (m delivery) Subject() string      { return m.subject }
func (m delivery) Headers() nats.Header { return m.header }
func (m delivery) Data() []byte         { return m.data }

// TestVerifyAhead_OneForgedOfABatch: of 32 deliveries verified together, the one whose body
// was changed after signing has a failed verdict and the other 31 a good one; its check
// fails all the same, and with a verdict claimed good by mistake for another key its check
// verifies it alone and fails (a verdict is trusted only for the key the check chooses).
// One from a source whose key is not known gets no verdict.
func TestVerifyAhead_OneForgedOfABatch(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	// The keys were learnt after the events were stored: a failed verification asks no one.
	c := &Client{self: api.WhoamiReply{Signers: api.Signers{api.SignerKey(api.SignerModule, "a"): pub}}, signersKnown: time.Now()}
	stored := time.Now().Add(-time.Minute)
	subject := manifest.EventSubject("a", "x")
	var msgs []jetstream.Msg
	var events []envelope.Event
	for i := range 32 {
		body := fmt.Appendf(nil, `{"n":%d}`, i)
		h, err := envelope.Stamp(kp, "a", "alpha", subject, body, envelope.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if i == 13 {
			body = []byte(`{"n":"forged"}`)
		}
		msgs = append(msgs, delivery{subject: subject, header: h, data: body})
		e, err := envelope.Read(subject, h, body)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, e)
	}
	pre := c.verifyAhead(msgs)
	for i, v := range pre {
		if v.key != pub || v.ok != (i != 13) {
			t.Errorf("delivery %d: verdict %+v", i, v)
		}
	}
	ctx := context.Background()
	if err := c.check(ctx, events[13], stored, false, pre[13]); !errors.Is(err, ErrRejected) {
		t.Fatalf("the forged event's check: %v, want rejected", err)
	}
	if err := c.check(ctx, events[13], stored, false, verdict{key: "another", ok: true}); !errors.Is(err, ErrRejected) {
		t.Fatalf("the forged event's check with another key's verdict: %v, want rejected", err)
	}
	if err := c.check(ctx, events[12], stored, false, pre[12]); err != nil {
		t.Fatalf("a genuine event's check: %v", err)
	}
	// A source without a known key: no verdict ahead.
	other := msgs[0].(delivery)
	other.subject = manifest.EventSubject("b", "x")
	if v := c.verifyAhead([]jetstream.Msg{msgs[1], other})[1]; v != (verdict{}) {
		t.Fatalf("a source without a known key got a verdict: %+v", v)
	}
}
