package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Series is what one side (the mesh or raw NATS) of a measurement did.
type Series struct {
	// Count is the number of operations completed: events received (each once), calls
	// answered, connections made.
	Count int `json:"count"`
	// Duplicates is the number of events delivered more than once (redeliveries); zero for
	// calls and connects.
	Duplicates int `json:"duplicates,omitempty"`
	// Elapsed is the wall time of the operations: first send to last receipt for events,
	// the sum of round trips for calls and connects. In nanoseconds in JSON.
	Elapsed time.Duration `json:"elapsed_ns"`
	// PerSecond is Count / Elapsed.
	PerSecond float64 `json:"per_second"`
	// P50, P99 and Mean are the latencies of one operation: emit to handler for events,
	// request to reply for calls, start to ready for connects. In nanoseconds in JSON.
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	Mean time.Duration `json:"mean_ns"`
	// Max is the slowest operation.
	Max time.Duration `json:"max_ns"`
}

// newSeries summarises latencies (it sorts them in place).
func newSeries(latencies []time.Duration, elapsed time.Duration) Series {
	s := Series{Count: len(latencies), Elapsed: elapsed}
	if len(latencies) == 0 {
		return s
	}
	slices.Sort(latencies)
	var sum time.Duration
	for _, d := range latencies {
		sum += d
	}
	s.Mean = sum / time.Duration(len(latencies))
	s.P50 = percentile(latencies, 50)
	s.P99 = percentile(latencies, 99)
	s.Max = latencies[len(latencies)-1]
	if elapsed > 0 {
		s.PerSecond = float64(s.Count) / elapsed.Seconds()
	}
	return s
}

// percentile is the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p int) time.Duration {
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 · n)
	return sorted[max(rank, 1)-1]
}

// ratio is a/b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// The payload of a timed event: 256 bytes of JSON whose fields sit at fixed offsets, so that
// reading the send time back costs the same on both sides and next to nothing.
//
//	{"run":"<8>","i":"<10 digits>","t":"<19 digits>","pad":"xxx…"}
const (
	PayloadSize = 256

	runAt, runLen = len(`{"run":"`), 8
	iAt, iLen     = runAt + runLen + len(`","i":"`), 10
	tAt, tLen     = iAt + iLen + len(`","t":"`), 19
	padAt         = tAt + tLen + len(`","pad":"`)
)

// payload returns event i of run, stamped with sent (time since the recorder's epoch).
func payload(run string, i int, sent time.Duration) []byte {
	b := make([]byte, 0, PayloadSize)
	b = fmt.Appendf(b, `{"run":"%s","i":"%010d","t":"%019d","pad":"`, run, i, int64(sent))
	for len(b) < PayloadSize-2 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}

// recorder collects the arrival of one run's timed events. Handlers of both sides call
// record; wait returns when every event has arrived once.
type recorder struct {
	run   string
	epoch time.Time // payload stamps are durations since epoch (monotonic)

	mu      sync.Mutex
	lat     []time.Duration // by event index
	seen    []bool
	got     int
	dups    int
	strays  int           // payloads of another run, or unreadable
	last    time.Duration // since epoch, of the latest first arrival
	changed chan struct{} // closed and replaced on every first arrival
}

func newRecorder(run string, epoch time.Time, n int) *recorder {
	return &recorder{run: run, epoch: epoch, lat: make([]time.Duration, n), seen: make([]bool, n), changed: make(chan struct{})}
}

// record notes the arrival of data now.
func (r *recorder) record(data []byte) {
	now := time.Since(r.epoch)
	i, sent, ok := r.parse(data)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !ok:
		r.strays++
	case r.seen[i]:
		r.dups++
	default:
		r.seen[i] = true
		r.lat[i] = now - sent
		r.got++
		r.last = now
		close(r.changed)
		r.changed = make(chan struct{})
	}
}

func (r *recorder) parse(data []byte) (i int, sent time.Duration, ok bool) {
	if len(data) < padAt || string(data[runAt:runAt+runLen]) != r.run {
		return 0, 0, false
	}
	i, err := strconv.Atoi(string(data[iAt : iAt+iLen]))
	if err != nil || i < 0 || i >= len(r.seen) {
		return 0, 0, false
	}
	t, err := strconv.ParseInt(string(data[tAt:tAt+tLen]), 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return i, time.Duration(t), true
}

// wait blocks until every event has arrived, ctx ends, or nothing arrives for stall.
func (r *recorder) wait(ctx context.Context, stall time.Duration) error {
	for {
		r.mu.Lock()
		got, changed := r.got, r.changed
		r.mu.Unlock()
		if got == len(r.seen) {
			return nil
		}
		select {
		case <-changed:
		case <-time.After(stall):
			return fmt.Errorf("%d of %d events never arrived (nothing for %s): %s", len(r.seen)-got, len(r.seen), stall, r.missing())
		case <-ctx.Done():
			return fmt.Errorf("%d of %d events arrived: %w", got, len(r.seen), ctx.Err())
		}
	}
}

// missing says which events have not arrived, and what else did: a stall at one event (a
// handler held) reads differently from a lost run of them.
func (r *recorder) missing() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var idx []string
	for i, ok := range r.seen {
		if !ok {
			if len(idx) == 8 {
				idx = append(idx, "…")
				break
			}
			idx = append(idx, strconv.Itoa(i))
		}
	}
	return fmt.Sprintf("events %s missing; %d duplicates, %d strays", strings.Join(idx, ", "), r.dups, r.strays)
}

// series summarises the run, whose first event was sent at start (since epoch).
func (r *recorder) series(start time.Duration) Series {
	r.mu.Lock()
	defer r.mu.Unlock()
	lat := make([]time.Duration, 0, r.got)
	for i, ok := range r.seen {
		if ok {
			lat = append(lat, r.lat[i])
		}
	}
	s := newSeries(lat, r.last-start)
	s.Duplicates = r.dups
	return s
}
