package embedbus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/internal/testbed"
)

// BenchmarkSyncPolicy is what JetStream's fsync policy costs a publisher that waits for each
// ack (as sdk.Emit does), and one that keeps 256 in flight (as EmitAsync): nats-server's
// background flush every 2 minutes, which the node keeps (docs/operations.md, "What a crash
// can lose"), against an fsync before every ack (`sync: always`). 256-byte events to a file
// stream on this machine's disk; events/s for each, and the ratio always/interval.
func BenchmarkSyncPolicy(b *testing.B) {
	for _, pol := range []struct {
		name   string
		always bool
	}{{"interval", false}, {"always", true}} {
		b.Run("sync="+pol.name, func(b *testing.B) {
			srv := testbed.NATSServer(b, &server.Options{JetStream: true, StoreDir: b.TempDir(), SyncAlways: pol.always})
			_, js := testbed.Connect(b, srv)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage}); err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 256)
			b.Run("one-at-a-time", func(b *testing.B) {
				for b.Loop() {
					if _, err := js.Publish(ctx, "s.x", data); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			})
			b.Run("pipelined", func(b *testing.B) {
				// A full window waits for acks as long as they take: with an fsync per message
				// on a loaded disk, longer than nats.go's 200 ms default (CI once failed there).
				ajs, _ := jetstream.New(js.Conn(), jetstream.WithPublishAsyncMaxPending(256))
				for b.Loop() {
					if _, err := ajs.PublishAsync("s.x", data, jetstream.WithStallWait(time.Minute)); err != nil {
						b.Fatal(err)
					}
				}
				select {
				case <-ajs.PublishAsyncComplete():
				case <-ctx.Done():
					b.Fatal("acks did not come")
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			})
		})
	}
}
