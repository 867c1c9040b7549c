package node

import (
	"context"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/throttle"
	"github.com/prometheus/client_golang/prometheus"
)

// The rate limits (throttle.Gate) pace what a module asks of the node — whoami, the vault,
// its seat tool — and drop the rest for the cost of a map lookup. A module that keeps on
// still costs its connection's reading and routing of every message, and a flood on a path
// no gate guards (tool calls to another module's seat, JetStream API requests) costs more.
// So a module that keeps on is barred: every connection of its key is closed, and the bus
// refuses its connects for flood-bar, doubling while it comes back flooding
// (throttle.Bans). Two things tell that it keeps on: a gate that refused it more than ten
// times its rate within two seconds (throttle.Gate.OnFlood), and a connection whose
// inbound messages exceed flood-rate a second with bursts of a second's worth (connRates),
// read from the server's connection list (Connz) every floodSample — four times a second,
// nothing per message — and sooner when the modules' total inbound count, read every
// floodPeek, says one of them may be over (walkSchedule); and a connection whose publishes
// the permissions keep denying (embedbus.Config.OnDenied).

// floodSample is how often the connections' message counts are read.
const floodSample = 250 * time.Millisecond

// Why a module was barred: the label of meshnode_flood_bars_total.
const (
	barRate    = "rate"    // its connection's inbound messages over flood-rate
	barRefused = "refused" // refused by a rate limit more than FloodFactor times its rate
	barDenied  = "denied"  // its connection's publishes denied more than DeniedFlood times
)

// pacing is the node's flood watch: the back-off of barred modules, the strikes the gates
// hand it, and its metrics.
type pacing struct {
	bans *throttle.Bans
	// strikes are the gates' identities that keep on past their refusals, for the watch to
	// bar: a gate tells under its lock, so it only hands them over.
	strikes chan strike
	bars    *prometheus.CounterVec
}

type strike struct {
	identity string // as the gate knows it: a key, a module, a vault caller
	cid      uint64 // or the connection the bus denied (embedbus.Config.OnDenied)
	refused  int
}

// newPacing makes the flood watch and hooks the node's own gate (whoami, the seat tool) to
// it; the vault's gate is hooked where the vault opens (floodingCaller).
func (n *Node) newPacing() {
	n.resp.pace = pacing{
		bans:    throttle.NewBans(time.Duration(n.cfg.FloodBar), time.Duration(n.cfg.FloodBarMax)),
		strikes: make(chan strike, 64),
		bars: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshnode_flood_bars_total",
			Help: "Modules this node disconnected and barred for flooding, by reason: rate (a connection's inbound messages over flood-rate a second, bursts of a second's worth), refused (refused by the rate limits more than ten times its rate-limit within 2 s) or denied (a connection's publishes denied by its permissions more than 1,000 times within 2 s).",
		}, []string{"reason"}),
	}
	for _, reason := range []string{barRate, barRefused, barDenied} {
		n.resp.pace.bars.WithLabelValues(reason) // at zero from the start: a rate query needs the series
	}
	n.resp.gate.OnFlood(n.floodingCaller)
}

// floodingCaller hands a gate's flooding identity to the watch; when the watch is behind,
// the gate tells again in its next window.
func (n *Node) floodingCaller(identity string, refused int) {
	select {
	case n.resp.pace.strikes <- strike{identity: identity, refused: refused}:
	default:
	}
}

// deniedConn hands a connection whose publishes the bus keeps denying to the watch, which
// bars its key: a request a module has no business sending is denied, and one that keeps
// on sending it is a flood.
func (n *Node) deniedConn(cid uint64, denied int) {
	select {
	case n.resp.pace.strikes <- strike{cid: cid, refused: denied}:
	default:
	}
}

// paceCollectors are the flood watch's metrics.
func (n *Node) paceCollectors() []prometheus.Collector {
	return []prometheus.Collector{n.resp.pace.bars, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "meshnode_flood_barred_modules",
		Help: "Modules barred for flooding now: their connects are refused until their bar ends.",
	}, func() float64 { return float64(n.resp.pace.bans.Len(time.Now())) })}
}

// watchFloods bars the modules that keep on flooding until ctx ends: those the gates and
// the bus tell of, and — with flood-rate set — those whose connection's rate stays over it.
func (n *Node) watchFloods(ctx context.Context) error {
	var tick <-chan time.Time
	if n.cfg.FloodRate > 0 {
		t := time.NewTicker(floodPeek)
		defer t.Stop()
		tick = t.C
	}
	rates := connRates{last: map[uint64]connSample{}}
	walks := walkSchedule{every: floodPeek}
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-n.resp.pace.strikes:
			if s.cid != 0 {
				if key, ok := n.bus.KeyOf(s.cid); ok {
					if e, ok := n.reg.ByKey(key); ok {
						n.bar(key, e.Module, barDenied, int64(s.refused))
					}
				}
			} else if key, module, ok := n.floodKey(s.identity); ok {
				n.bar(key, module, barRefused, int64(s.refused))
			}
		case now := <-tick:
			if !walks.due(n.bus.ClientInMsgs(), now, float64(n.cfg.FloodRate)) {
				continue
			}
			over, ok := rates.sample(n.bus.ClientStats(), now, float64(n.cfg.FloodRate), n.isModule)
			walks.walked(now, ok)
			if ok {
				if e, ok := n.reg.ByKey(over.key); ok {
					n.bar(over.key, e.Module, barRate, over.msgs)
				}
			}
		}
	}
}

// floodPeek is how often the watch reads the modules' total inbound count (one counter,
// embedbus.Bus.ClientInMsgs): a flood far over the rate is found within a peek or two.
const floodPeek = 25 * time.Millisecond

// walkSchedule says when the watch lists the connections' counts (a Connz, whose cost grows
// with the connections): every floodSample, and sooner when the modules together sent more
// since the last list than one connection may — which a flood does, and a busy mesh of
// many modules may do all the time, so an early list that finds nobody over the rate
// doubles the wait before the next early one, up to floodSample, until a quiet spell.
type walkSchedule struct {
	every time.Duration // the least time between lists now
	at    time.Time     // the last list
	total int64         // the total inbound count at the last list
	next  int64         // the total due last saw, for walked
	early bool          // whether due called the list early
	quiet bool          // whether the modules sent less than one connection may since the last list
}

// due reports whether to list the connections at now, the modules' total inbound count
// being total.
func (w *walkSchedule) due(total int64, now time.Time, perSecond float64) bool {
	since := now.Sub(w.at)
	over := float64(total-w.total) > perSecond*since.Seconds()
	w.next, w.quiet, w.early = total, !over, false
	if since >= floodSample {
		return true
	}
	w.early = over && since >= w.every
	return w.early
}

// walked records a list made at now; found says whether it found a connection over the
// rate.
func (w *walkSchedule) walked(now time.Time, found bool) {
	w.at, w.total = now, w.next
	switch {
	case found || w.quiet:
		w.every = floodPeek
	case w.early:
		w.every = min(2*w.every, floodSample)
	}
}

// floodKey is the key and module of a gate's identity: a module's key (whoami), its name
// (the seat tool) or its vault caller (mod.<name>). A join token is not barred: it is
// spent, or expires, by itself.
func (n *Node) floodKey(identity string) (key, module string, ok bool) {
	if e, ok := n.reg.ByKey(identity); ok {
		return identity, e.Module, true
	}
	name := strings.TrimPrefix(identity, api.VaultModuleCaller(""))
	if e, ok := n.reg.Get(name); ok {
		return e.PublicKey, e.Module, true
	}
	return "", "", false
}

// bar disconnects every connection of key and refuses it until its bar ends, unless it is
// barred already; it is reported once, as a log line and a node event with the count that
// gave it away.
func (n *Node) bar(key, module, reason string, count int64) {
	until, strikes, ok := n.resp.pace.bans.Strike(key, time.Now())
	if !ok {
		return
	}
	closed := n.bus.Bar(key, until)
	n.resp.pace.bars.WithLabelValues(reason).Inc()
	barFor := time.Until(until).Round(time.Second)
	n.log.Warn("module barred for flooding: its connections are closed and its connects refused until the bar ends",
		"module", module, "key", key, "reason", reason, "count", count, "connections", closed, "bar", barFor, "strikes", strikes)
	// The node's own connection, open while the watch runs (Run): not the cluster's event
	// connection, which a single node has none of.
	publishNodeEvent(n.bus.Conn(), n.key, n.id.Name, "flood-barred", map[string]any{
		"module": module, "key": key, "reason": reason, "count": count, "connections": closed,
		"until": until.UTC(), "strikes": strikes,
	}, n.log)
}

// connRates follows each connection's inbound message count from sample to sample, as a
// token bucket per connection: perSecond tokens a second, at most a second's worth, one
// spent per message. A connection that empties its bucket has kept up more than perSecond
// for long enough to have sent a second's worth beyond it — at twice the rate in a second,
// at thirty times in the first sample.
type connRates struct {
	last map[uint64]connSample // by connection id
	// graced are the keys forgiven until a time: those sending over the rate when another
	// was barred (floodGrace).
	graced map[string]time.Time
}

// floodGrace is how long the keys sending over the rate, or sent to over it, when a flooder
// is barred are forgiven: a flood of requests makes their answerer send as fast (a seat's
// holder answering a flood of its tool), and after the flooder is cut off it still answers
// what it was sent, on a new connection if the server dropped it as a slow consumer. Found
// within a peek of the flood's start, the answerer may not have answered much yet; what was
// delivered to it says it will.
const floodGrace = 5 * time.Second

type connSample struct {
	key    string
	at     time.Time
	msgs   int64   // its count at the last sample
	tokens float64 // what is left of its bucket
	from   int64   // its count when its bucket was last full
	out    int64   // the messages delivered to it, at the last sample
	// sentTo says that more was delivered to it since the sample before than one connection
	// may send in that time: a seat's holder answering a flood of its tool, say.
	sentTo bool
}

// rateOver is a connection that emptied its bucket: its key and how many messages it sent
// since its bucket was last full.
type rateOver struct {
	key  string
	msgs int64
}

// sample takes the counts read at now and returns the module connection that emptied its
// bucket and sent the most since it was full; connections gone are forgotten. A connection
// that has been sent at least as many messages as it sent is answering, not flooding, and
// never returned (a module whose every request is answered at once is bounded by its
// answerer's pace). One at a time, and every other connection over the rate then is graced
// (floodGrace): what a flood made others send stops with it.
func (r *connRates) sample(stats []embedbus.ClientStat, now time.Time, perSecond float64, isModule func(key string) bool) (top rateOver, found bool) {
	seen := make(map[uint64]connSample, len(stats))
	for _, st := range stats {
		s := connSample{key: st.Key, at: now, msgs: st.InMsgs, tokens: perSecond, from: st.InMsgs, out: st.OutMsgs}
		if prev, ok := r.last[st.ID]; ok {
			s.sentTo = float64(st.OutMsgs-prev.out) > perSecond*now.Sub(prev.at).Seconds()
		}
		if prev, ok := r.last[st.ID]; ok && !now.Before(r.graced[st.Key]) {
			s.tokens = min(perSecond, prev.tokens+perSecond*now.Sub(prev.at).Seconds()) - float64(st.InMsgs-prev.msgs)
			if s.tokens < perSecond {
				s.from = prev.from
			}
			if sent := st.InMsgs - s.from; s.tokens < 0 && sent > top.msgs && st.InMsgs > st.OutMsgs && isModule(st.Key) {
				top, found = rateOver{key: st.Key, msgs: sent}, true
			}
		}
		seen[st.ID] = s
	}
	for key, until := range r.graced {
		if !now.Before(until) {
			delete(r.graced, key)
		}
	}
	if found {
		if r.graced == nil {
			r.graced = map[string]time.Time{}
		}
		for id, s := range seen {
			if s.tokens < perSecond || s.sentTo {
				r.graced[s.key] = now.Add(floodGrace)
			}
			s.tokens, s.from = perSecond, s.msgs
			seen[id] = s
		}
		delete(r.graced, top.key)
	}
	r.last = seen
	return top, found
}

// isModule reports whether key is a registered module's: only a module is barred.
func (n *Node) isModule(key string) bool {
	_, ok := n.reg.ByKey(key)
	return ok
}
