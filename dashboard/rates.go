package dashboard

import (
	"sync"
	"time"
)

// counts are the node's running totals the console charts (Config.Counters).
type counts struct {
	Events uint64 // events its audit log took in
	// Errors are what went wrong with events on this node: dead letters written or lost,
	// emits refused at admission, records of the audit log that are not genuine events.
	Errors uint64
}

// Chart bounds.
const (
	rateWindow       = time.Hour        // how far back the charts go
	defaultRateEvery = 10 * time.Second // one bar of a chart
)

// Rates are what the console charts: per interval of EveryMS milliseconds, oldest first, the events
// and the errors counted in it, the last interval ending at End. They start empty when the
// node starts: the counters are its own.
type Rates struct {
	EveryMS int64     `json:"every_ms"`
	End     time.Time `json:"end"`
	Events  []uint64  `json:"events"`
	Errors  []uint64  `json:"errors"`
}

// rater reads the counters every interval and keeps the last hour's differences.
type rater struct {
	read  func() (events, errors uint64)
	every time.Duration

	mu     sync.Mutex
	last   counts
	end    time.Time
	events []uint64 // newest last, at most rateWindow/every
	errors []uint64
}

// sample reads the counters and records what they counted since the last read.
func (r *rater) sample(now time.Time) {
	var c counts
	c.Events, c.Errors = r.read()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.end.IsZero() {
		keep := int(rateWindow / r.every)
		r.events = appendBounded(r.events, diff(c.Events, r.last.Events), keep)
		r.errors = appendBounded(r.errors, diff(c.Errors, r.last.Errors), keep)
	}
	r.last, r.end = c, now.UTC().Truncate(time.Millisecond)
}

// rates are the intervals recorded so far; nil before the second read.
func (r *rater) rates() *Rates {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) == 0 {
		return nil
	}
	return &Rates{EveryMS: r.every.Milliseconds(), End: r.end, Events: append([]uint64(nil), r.events...), Errors: append([]uint64(nil), r.errors...)}
}

// run samples every interval until the dashboard closes.
func (r *rater) run(d *Dashboard) {
	defer d.wg.Done()
	r.sample(time.Now())
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case now := <-t.C:
			r.sample(now)
		}
	}
}

// diff is what a counter counted between two reads (nothing if it went back: a counter
// made again).
func diff(now, before uint64) uint64 {
	if now < before {
		return 0
	}
	return now - before
}

func appendBounded(xs []uint64, x uint64, most int) []uint64 {
	xs = append(xs, x)
	if len(xs) > most {
		xs = append(xs[:0], xs[len(xs)-most:]...)
	}
	return xs
}
