package throttle

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// DefaultInterval is how often a Gate reports the refusals it counted.
const DefaultInterval = 10 * time.Second

// idleAfter is how long an identity's bucket is kept without a request; after it the bucket
// would be full again anyway, so forgetting it changes nothing but memory.
const idleAfter = time.Minute

// Refusal is what a Gate reports: Identity was refused Count times for Reason during the
// interval ending at Until; Detail is the last refusal's message ("" for rate refusals).
type Refusal struct {
	Identity string
	Reason   string
	Count    int
	Detail   string
	Until    time.Time
}

type refusalKey struct{ identity, reason string }

type refusalCount struct {
	n      int
	detail string
}

// Gate is a token bucket per identity plus a refusal counter per identity and reason. The
// identity must be proven by the caller (a subject only that identity may publish on), or a
// flood could spend another identity's budget.
type Gate struct {
	limit    rate.Limit
	burst    int
	interval time.Duration
	report   func(Refusal)

	// onFlood, when set, is told of an identity that keeps on past its refusals (OnFlood).
	onFlood func(identity string, refused int)

	mu      sync.Mutex
	buckets map[string]*bucket
	refused map[refusalKey]refusalCount // since the last report
}

type bucket struct {
	lim   *rate.Limiter
	seen  time.Time
	told  time.Time // when a refusal was last answered
	flood Window    // the refusals of the current flood window
}

// FloodWindow and FloodFactor say when an identity keeps on past its refusals: refused
// more than FloodFactor times its rate within FloodWindow, that is sending at least eleven
// times what it may for two seconds — no client that backs off when refused, nor a burst.
const (
	FloodWindow = 2 * time.Second
	FloodFactor = 10
)

// OnFlood sets f to be told, at most once per FloodWindow per identity and on the goroutine
// whose request was refused (so f must be quick), when an identity keeps on past its
// refusals; refused is how many it had in the window. Set it before the gate is used. A
// gate without a limit never tells.
func (g *Gate) OnFlood(f func(identity string, refused int)) { g.onFlood = f }

// tellEvery is how often a refused identity is told so; the refusals between are dropped
// unanswered, so a flood costs the node a map lookup per request and no reply.
const tellEvery = time.Second

// New returns a gate allowing each identity perSecond requests on average and burst at once
// (perSecond zero: no limit), and reporting refusals every interval (zero: DefaultInterval)
// through report (nil: none).
func New(perSecond float64, burst int, interval time.Duration, report func(Refusal)) *Gate {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if perSecond <= 0 {
		perSecond, burst = float64(rate.Inf), 0
	}
	return &Gate{limit: rate.Limit(perSecond), burst: burst, interval: interval, report: report,
		buckets: map[string]*bucket{}, refused: map[refusalKey]refusalCount{}}
}

// PerSecond is the rate each identity may keep up.
func (g *Gate) PerSecond() float64 { return float64(g.limit) }

// Allow reports whether identity may be served now. A refusal is counted (reason "rate"),
// and tell says whether to answer it: at most once a second per identity.
func (g *Gate) Allow(identity string) (ok, tell bool) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.buckets[identity]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(g.limit, g.burst)}
		g.buckets[identity] = b
	}
	b.seen = now
	if b.lim.AllowN(now, 1) {
		return true, false
	}
	k := refusalKey{identity, "rate"}
	g.refused[k] = refusalCount{n: g.refused[k].n + 1}
	g.countFlood(identity, b, now)
	if now.Sub(b.told) >= tellEvery {
		b.told = now
		return false, true
	}
	return false, false
}

// countFlood counts a rate refusal of identity in its flood window, and tells onFlood once
// the window holds more than FloodFactor times the rate (under mu).
func (g *Gate) countFlood(identity string, b *bucket, now time.Time) {
	if g.onFlood == nil {
		return
	}
	if flooded, n := b.flood.Refused(now, FloodWindow, int(FloodFactor*float64(g.limit)*FloodWindow.Seconds())); flooded {
		g.onFlood(identity, n)
	}
}

// Refused counts a refusal of identity for reason (a short, fixed category such as the verb
// refused), to be reported with the others of the interval; detail is the refusal's message,
// and the last one is reported.
func (g *Gate) Refused(identity, reason, detail string) {
	g.mu.Lock()
	k := refusalKey{identity, reason}
	g.refused[k] = refusalCount{n: g.refused[k].n + 1, detail: detail}
	g.mu.Unlock()
}

// Flush reports what was counted since the last report and forgets idle identities.
func (g *Gate) Flush() {
	now := time.Now()
	g.mu.Lock()
	counts := g.refused
	g.refused = map[refusalKey]refusalCount{}
	for id, b := range g.buckets {
		if now.Sub(b.seen) > idleAfter {
			delete(g.buckets, id)
		}
	}
	g.mu.Unlock()
	if g.report == nil {
		return
	}
	for k, c := range counts {
		g.report(Refusal{Identity: k.identity, Reason: k.reason, Count: c.n, Detail: c.detail, Until: now})
	}
}

// Start runs Run on its own goroutine; stop ends it and returns once the last report is made.
func (g *Gate) Start() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// Run flushes every interval until ctx ends, then once more.
func (g *Gate) Run(ctx context.Context) {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			g.Flush()
			return
		case <-t.C:
			g.Flush()
		}
	}
}
