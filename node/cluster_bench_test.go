package node_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/meshnode/meshnode/bench"
	"github.com/meshnode/meshnode/datadir"
)

// BenchmarkEmitR3 sends the same events emit→on (sdk Emit, one synchronous JetStream
// publish after another, handled by sdk On) through a single node, whose EVENTS stream has
// one replica, and through a mesh of three in-process servers, whose EVENTS has three, in the
// same run; and raw JetStream on each (a stream of as many replicas) for reference. Run with:
//
//	go test -run '^$' -bench EmitR3 -benchtime 1x ./node/
//
// All three servers share this machine's cores, so R3 pays for the replication's CPU as well
// as its round trips.
func BenchmarkEmitR3(b *testing.B) {
	const events = 3000
	ctx := context.Background()
	measure := func(url, opSeed string, replicas int) (mesh, raw bench.Series) {
		s, err := bench.OpenEmitOn(ctx, bench.Target{URL: url, OperatorSeed: opSeed, Dir: b.TempDir(), Replicas: replicas})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if mesh, err = s.Mesh(ctx, events); err != nil {
			b.Fatal(err)
		}
		if raw, err = s.Raw(ctx, events); err != nil {
			b.Fatal(err)
		}
		return mesh, raw
	}
	for range b.N {
		single := newBed(b)
		r1, raw1 := measure(single.n.ClientURL(), filepath.Join(single.dir, datadir.OperatorSeedFile), 1)
		single.close()

		cfgs, nodes := openThree(b)
		ctx, cancel := context.WithCancel(context.Background())
		var runs sync.WaitGroup
		for _, n := range nodes {
			runs.Add(1)
			go func() { defer runs.Done(); n.Run(ctx) }()
		}
		r3, raw3 := measure(nodes[1].ClientURL(), filepath.Join(cfgs[0].DataDir, datadir.OperatorSeedFile), 3)
		cancel()
		runs.Wait()
		for _, n := range nodes {
			n.Close()
		}
		b.ReportMetric(r1.PerSecond, "R1-events/s")
		b.ReportMetric(r3.PerSecond, "R3-events/s")
		b.ReportMetric(r3.PerSecond/r1.PerSecond, "R3/R1")
		b.ReportMetric(raw1.PerSecond, "raw-R1-events/s")
		b.ReportMetric(raw3.PerSecond, "raw-R3-events/s")
		b.ReportMetric(float64(r3.P50.Microseconds()), "R3-p50-µs")
		b.ReportMetric(float64(r1.P50.Microseconds()), "R1-p50-µs")
	}
}
