package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/nats-io/nats.go"
)

// BenchmarkVaultFetch is a module's fetch round trip: the request with a one-time xkey, the
// barrier decrypt, the seal, the reply, the open. BenchmarkVaultFetchRaw is a plain NATS
// request/reply of the same size on the same server, for the ratio (issue 6).
//
//	go test -run '^$' -bench VaultFetch -benchtime 2000x ./node/
func BenchmarkVaultFetch(b *testing.B) {
	cfg := testConfig(b.TempDir(), "alpha")
	cfg.RateLimit = 0 // the path's speed, not the rate limit's
	bd := newBedAt(b, cfg)
	seed, _ := bd.register("module: api\nrequires: [mesh-bus]\nsecrets: [k]\n")
	if _, err := bd.vault(api.VaultVerbMint, api.VaultRequest{Owner: "api", Name: "k"}, nil); err != nil {
		b.Fatal(err)
	}
	c := bd.client(seed)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := c.Secret(ctx, "k"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/fetch")
}

func BenchmarkVaultFetchRaw(b *testing.B) {
	bd := newBed(b)
	server := bd.operatorConn()
	defer server.Close()
	value := make([]byte, 43)
	sub, err := server.Subscribe("bench.raw.fetch", func(m *nats.Msg) { m.Respond(value) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	server.Flush()
	client := bd.operatorConn()
	defer client.Close()
	req := make([]byte, 120)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := client.Request("bench.raw.fetch", req, 5*time.Second); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/fetch")
}
