package node_test

import (
	"context"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// BenchmarkEmitPath splits the emitter's side of an event sent one at a time — what bounds
// the mesh's one-at-a-time rate against the signed floor (issue 41) — into its steps, on one
// node, nothing consuming but the audit log. signed-direct is the floor's publish: an event
// stamped and signed with envelope.Stamp, published on its stream's subject by a connection
// that may (the operator's). signed-via-admitter is the same event under the module's admit
// prefix, from the module's own plain NATS connection: what the admitter's hop adds.
// sdk-emit is sdk Emit of the same event: what the sdk adds on top. Run:
//
//	go test -run '^$' -bench EmitPath -benchtime 20000x -count 3 ./node/
func BenchmarkEmitPath(b *testing.B) {
	cfg := testConfig(b.TempDir(), "alpha")
	cfg.EmitRate, cfg.FloodRate = 0, 0 // the path's speed, not the paces'
	bd := newBedAt(b, cfg)
	seed, reg := bd.register("module: p\nrequires: [mesh-bus]\nemits: [tick]\n")
	client := bd.client(seed)
	js, err := jetstream.New(bd.raw(seed, "p"))
	if err != nil {
		b.Fatal(err)
	}
	// Signed with p's own key, as the sdk signs: the audit log's batch of the events then
	// verifies at once. Under another key every batch failed, and the log checked each event
	// alone, 17 µs of CPU an event more beside the emitter than sdk-emit had.
	kp, err := nkeys.FromSeed(reg.Seed)
	if err != nil {
		b.Fatal(err)
	}
	key, err := envelope.NewSigningKey(kp)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	data := []byte(`"` + strings.Repeat("a", 254) + `"`) // the bench's 256 bytes
	subject := manifest.EventSubject("p", "tick")
	signed := func(b *testing.B, js jetstream.JetStream, on string) {
		for b.Loop() {
			h, err := envelope.Stamp(key, "p", "alpha", subject, data, envelope.Options{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: on, Header: h, Data: data}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("signed-direct", func(b *testing.B) { signed(b, bd.js, subject) })
	b.Run("signed-via-admitter", func(b *testing.B) { signed(b, js, manifest.AdmitSubject("p", subject)) })
	b.Run("sdk-emit", func(b *testing.B) {
		for b.Loop() {
			if _, err := client.Emit(ctx, "tick", data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
