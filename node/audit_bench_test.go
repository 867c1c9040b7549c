package node_test

import (
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkAuditSustained emits as fast as sdk.Emit goes (the bus benchmark's rate) for 60 s
// (MESHNODE_BENCH_SECONDS to change it) and samples the audit lag every second: the figures
// are the emit rate, the audit's ingest rate over the same window, the lag's maximum,
// mean over the last half and final value — bounded, not growing, is the target (issue 7) —
// and the events the log missed (a lag EVENTS' per-subject cap bounds at 100,000 for one
// subject: past it, unread events are evicted).
// MESHNODE_BENCH_PIPELINED=1 emits with sdk.EmitAsync instead: the mesh's highest emit rate
// (issue 20: the lag stays bounded there too).
//
//	go test -run '^$' -bench AuditSustained -benchtime 1x ./node/
func BenchmarkAuditSustained(b *testing.B) {
	seconds := 60
	if s, err := strconv.Atoi(os.Getenv("MESHNODE_BENCH_SECONDS")); err == nil && s > 0 {
		seconds = s
	}
	bd := newBed(b)
	seed, _ := bd.register("module: m\nrequires: [mesh-bus]\nemits: [tick]\n")
	c := bd.client(seed)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second)
	defer cancel()
	var emitted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		body := make([]byte, 256)
		pipelined := os.Getenv("MESHNODE_BENCH_PIPELINED") != ""
		for ctx.Err() == nil {
			var err error
			if pipelined {
				_, err = c.EmitAsync(context.Background(), "tick", body)
			} else {
				_, err = c.Emit(context.Background(), "tick", body)
			}
			if err != nil {
				return
			}
			emitted.Add(1)
		}
		if pipelined {
			c.Flush(context.Background())
		}
	}()
	startRecords := bd.n.Status(context.Background()).Audit.Records
	start := time.Now()
	var lags []uint64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
			lags = append(lags, bd.n.Status(context.Background()).Audit.Lag)
		case <-ctx.Done():
		}
	}
	<-done
	elapsed := time.Since(start).Seconds()
	end := bd.n.Status(context.Background()).Audit
	var maxLag, lateSum uint64
	for i, l := range lags {
		maxLag = max(maxLag, l)
		if i >= len(lags)/2 {
			lateSum += l
		}
	}
	late := float64(lateSum) / float64(max(1, len(lags)-len(lags)/2))
	b.ReportMetric(float64(emitted.Load())/elapsed, "emit/s")
	b.ReportMetric(float64(end.Records-startRecords)/elapsed, "audited/s")
	b.ReportMetric(float64(maxLag), "max-lag")
	b.ReportMetric(late, "mean-lag-last-half")
	b.ReportMetric(float64(end.Lag), "final-lag")
	// Events EVENTS evicted (its per-subject cap) before the audit read them: the log's gaps
	// while it is behind.
	b.ReportMetric(float64(end.Missed), "missed")
}
