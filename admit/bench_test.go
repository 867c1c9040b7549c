package admit

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// cpuTime is the CPU this process has used: the server, the admitter and the publisher
// are all in it, so the difference of two runs is what the hop costs the machine.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAdmitHop measures what the admitter's hop costs an event (issue 35: ≤ 5 µs of
// CPU): b.N events of an envelope's headers and a 256-byte body, pipelined by one module
// over TCP into a file-backed stream, straight to the stream (direct) and through the
// admitter — on an in-process connection, as the node's — with a quota and its
// bookkeeping (admitted), in turns in the same run. It reports each
// one's CPU per event (the whole process: server, admitter, publisher) and their
// difference, hop-cpu-µs.
//
//	go test -run '^$' -bench AdmitHop -benchtime 100000x ./admit
func BenchmarkAdmitHop(b *testing.B) {
	srv := testbed.NATSServer(b, &server.Options{JetStream: true, StoreDir: b.TempDir()})
	nc, js := testbed.Connect(b, srv)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: manifest.EventPatterns()}); err != nil {
		b.Fatal(err)
	}
	a, err := New(Config{Dial: srv.InProcessConn, Limit: 1 << 40, Held: func(string) int64 { return 0 },
		Owners: func(m string) []string { return []string{"mod." + m} }})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	pub, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1024))
	subject := manifest.EventSubject("a", "x")
	body := make([]byte, 256)
	run := func(to string, n int) time.Duration {
		c0 := cpuTime()
		for i := range n {
			id := fmt.Sprintf("%s-%d-%d", to, time.Now().UnixNano(), i)
			h := nats.Header{}
			h.Set(envelope.EventID, id)
			h.Set(nats.MsgIdHdr, id)
			h.Set(envelope.Source, "a")
			h.Set(envelope.Node, "alpha")
			h.Set(envelope.Time, time.Now().UTC().Format(time.RFC3339Nano))
			h.Set(envelope.ContentType, envelope.JSON)
			h.Set(envelope.Signature, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
			// A loaded machine answers late: wait for room rather than fail the measurement
			// (nats.go stalls an async publish past 200 ms by default).
			if _, err := pub.PublishMsgAsync(&nats.Msg{Subject: to, Header: h, Data: body}, jetstream.WithStallWait(time.Minute)); err != nil {
				b.Fatal(err)
			}
			if i%4096 == 4095 { // keep memory flat: the admitter's pending map is swept here
				<-pub.PublishAsyncComplete()
				a.Recorded(nil, time.Now().Add(time.Hour), func() {})
				a.Sweep(false)
			}
		}
		<-pub.PublishAsyncComplete()
		return cpuTime() - c0
	}
	run(subject, 1000) // warm both paths
	run(manifest.AdmitSubject("a", subject), 1000)
	b.ResetTimer()
	// In turns of 10,000, so that what else the machine does weighs on both alike.
	var direct, admitted time.Duration
	var hops []float64 // each pair of turns' difference, µs an event
	for done := 0; done < b.N; done += 10_000 {
		n := min(10_000, b.N-done)
		d := run(subject, n)
		a := run(manifest.AdmitSubject("a", subject), n)
		direct, admitted = direct+d, admitted+a
		hops = append(hops, float64((a-d).Nanoseconds())/1000/float64(n))
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(per(direct), "direct-cpu-µs")
	b.ReportMetric(per(admitted), "admitted-cpu-µs")
	// The hop is a difference of two CPU times of about 20 µs an event that the machine's
	// other work moves by a µs or more, a turn at a time: the median of the pairs' differences
	// is the hop's cost with a turn the machine disturbed left out; the mean, every turn.
	slices.Sort(hops)
	b.ReportMetric(hops[len(hops)/2], "hop-cpu-µs")
	b.ReportMetric(per(admitted)-per(direct), "hop-mean-cpu-µs")
}
