package node_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go/jetstream"
)

// Seat benchmarks (issue 5). Run with:
//
//	go test -run '^$' -bench Seat -benchtime 5x ./node/
//
// BenchmarkSeatJobs and BenchmarkSeatJobsRaw push the same number of 256-byte jobs the same
// way (one synchronous JetStream publish after another, handled by one pull consumer that
// acks each), through a seat and through a bare work-queue stream on the same server.

var payload256 = make([]byte, 256)

func BenchmarkSeatJobs(b *testing.B) {
	const jobs = 2000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		bd := newBed(b)
		mailerSeed, _ := bd.register(mailerManifest)
		shopSeed, _ := bd.register(shopManifest)
		var done atomic.Int64
		finished := make(chan struct{})
		h := bd.client(mailerSeed)
		if err := h.Accept("send", func(context.Context, sdk.Job) error {
			if done.Add(1) == jobs {
				close(finished)
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		waitHolding(b, h, "mailer")
		shop := bd.client(shopSeed)
		ctx := context.Background()
		b.StartTimer()
		start := time.Now()
		for range jobs {
			if _, err := shop.Submit(ctx, "mailer", "send", payload256); err != nil {
				b.Fatal(err)
			}
		}
		<-finished
		b.ReportMetric(jobs/time.Since(start).Seconds(), "jobs/s")
		b.StopTimer()
		bd.close()
	}
}

func BenchmarkSeatJobsRaw(b *testing.B) {
	const jobs = 2000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		bd := newBed(b)
		ctx := context.Background()
		js := bd.js
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAWQ", Subjects: []string{"rawq.>"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
			b.Fatal(err)
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, "RAWQ", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 32})
		if err != nil {
			b.Fatal(err)
		}
		var done atomic.Int64
		finished := make(chan struct{})
		cc, err := cons.Consume(func(m jetstream.Msg) {
			m.Ack()
			if done.Add(1) == jobs {
				close(finished)
			}
		}, jetstream.PullMaxMessages(32))
		if err != nil {
			b.Fatal(err)
		}
		pub := bd.operatorConn()
		pjs, _ := jetstream.New(pub)
		b.StartTimer()
		start := time.Now()
		for range jobs {
			if _, err := pjs.Publish(ctx, "rawq.send", payload256); err != nil {
				b.Fatal(err)
			}
		}
		<-finished
		b.ReportMetric(jobs/time.Since(start).Seconds(), "jobs/s")
		b.StopTimer()
		cc.Stop()
		pub.Close()
		bd.close()
	}
}

// BenchmarkSeatFailover: the holder's connection drops (no release, no ack); the figure is
// the time until a job submitted at that moment is handled by the next holder. Target:
// ≤ lease TTL + 1s.
func BenchmarkSeatFailover(b *testing.B) { benchmarkHandover(b, false) }

// BenchmarkSeatHandoff: the holder closes gracefully (it releases the lease). Target: ≤ 500ms.
func BenchmarkSeatHandoff(b *testing.B) { benchmarkHandover(b, true) }

func benchmarkHandover(b *testing.B, graceful bool) {
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		bd := newBed(b)
		mailerSeed, _ := bd.register(mailerManifest)
		shopSeed, _ := bd.register(shopManifest)
		first := bd.client(mailerSeed)
		first.Accept("send", func(context.Context, sdk.Job) error { return nil })
		waitHolding(b, first, "mailer")
		handled := make(chan struct{}, 1)
		second := bd.client(mailerSeed)
		second.Accept("send", func(context.Context, sdk.Job) error {
			select {
			case handled <- struct{}{}:
			default:
			}
			return nil
		})
		shop := bd.client(shopSeed)
		b.StartTimer()
		start := time.Now()
		if graceful {
			first.Close()
		} else {
			first.Conn().Close()
		}
		if _, err := shop.Submit(context.Background(), "mailer", "send", payload256); err != nil {
			b.Fatal(err)
		}
		select {
		case <-handled:
		case <-time.After(30 * time.Second):
			b.Fatal("the next holder never handled the job")
		}
		total += time.Since(start)
		b.StopTimer()
		bd.close()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-next-holder")
}

func waitHolding(b *testing.B, c *sdk.Client, seat string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ok, _ := c.Holding(seat); ok {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s never held %s", c.Instance(), seat)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
