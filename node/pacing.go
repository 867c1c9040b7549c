package node

import (
	"context"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/floodwatch"
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
// inbound messages exceed flood-rate a second with bursts of a quarter second's worth (package
// floodwatch: read from the server's connection list four times a second, nothing per
// message, and sooner when the modules' total inbound count says one may be over); and a
// connection whose publishes the permissions keep denying (embedbus.Config.OnDenied).

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
			Help: "Modules this node disconnected and barred for flooding, by reason: rate (a connection's inbound messages over flood-rate a second, bursts of a quarter second's worth), refused (refused by the rate limits more than ten times its rate-limit within 2 s) or denied (a connection's publishes denied by its permissions more than 1,000 times within 2 s).",
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
		t := time.NewTicker(floodwatch.Peek)
		defer t.Stop()
		tick = t.C
	}
	var rates floodwatch.Rates
	var walks floodwatch.Schedule
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
			if !walks.Due(n.bus.ClientInMsgs(), now, float64(n.cfg.FloodRate)) {
				continue
			}
			// The counts' time is when they were read: a long list takes a while.
			stats := n.bus.ClientStats()
			read := time.Now()
			over, ok, draining := rates.Sample(stats, read, float64(n.cfg.FloodRate), n.isModule)
			walks.Walked(read, ok || draining)
			if ok {
				if e, ok := n.reg.ByKey(over.Key); ok {
					n.bar(over.Key, e.Module, barRate, over.Msgs)
				}
			}
		}
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

// isModule reports whether key is a registered module's: only a module is barred.
func (n *Node) isModule(key string) bool {
	_, ok := n.reg.ByKey(key)
	return ok
}
