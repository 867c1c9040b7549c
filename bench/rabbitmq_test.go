//go:build rabbitmq

package bench_test

import (
	"context"
	"os"
	"testing"

	"github.com/meshnode/meshnode/bench"
	"github.com/meshnode/meshnode/internal/testbed"
)

// BenchmarkEmitOnRabbitMQ times b.N events through RabbitMQ as ADR 42's contract used it
// (bench.RabbitMQ: persistent, publisher confirms one at a time, manual acks) and, in the same
// run, b.N through the mesh one at a time (sdk.Emit → On) and through the signed floor: the
// comparison with the system the seed replaced stays measured. It needs a broker:
//
//	MESHNODE_BENCH_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5672/ \
//	  go test -tags rabbitmq -run '^$' -bench EmitOnRabbitMQ -benchtime 20000x ./bench/
//
// and is skipped without one.
func BenchmarkEmitOnRabbitMQ(b *testing.B) {
	url := os.Getenv("MESHNODE_BENCH_RABBITMQ_URL")
	if url == "" {
		testbed.Skip(b, "no broker: set MESHNODE_BENCH_RABBITMQ_URL (Debian's rabbitmq-server listens on amqp://guest:guest@127.0.0.1:5672/)")
	}
	ctx := context.Background()
	b.ResetTimer()
	rabbit, err := bench.RabbitMQ(ctx, url, b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	s := emitOnSession(b)
	mesh, err := s.Mesh(ctx, b.N)
	if err != nil {
		b.Fatal(err)
	}
	floor, err := s.RawSigned(ctx, b.N)
	if err != nil {
		b.Fatal(err)
	}
	reportSeries(b, "", rabbit, "events/s")
	reportSeries(b, "mesh-", mesh, "events/s")
	b.ReportMetric(mesh.PerSecond/rabbit.PerSecond, "mesh/rabbitmq")
	b.ReportMetric(floor.PerSecond/rabbit.PerSecond, "floor/rabbitmq")
}
