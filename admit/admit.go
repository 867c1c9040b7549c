package admit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/throttle"
	"github.com/nats-io/nkeys"
	"golang.org/x/time/rate"
)

// QueueGroup is the admitters' queue group: nats-server hands a message to a queue
// subscriber on the server it arrived at before any other, so each node admits what its own
// modules send, and another node's admitter takes over only while this one is gone.
const QueueGroup = "mesh-admit"

// Config is what an Admitter needs.
type Config struct {
	// Dial opens a connection to the node's server (in-process: embedbus.Bus.Dial), and Key
	// authenticates it (nil: none): an identity that may take manifest.AdmitAll in
	// QueueGroup, publish on the streams' subjects and answer into inboxes (Permissions).
	Dial func() (net.Conn, error)
	Key  nkeys.KeyPair
	Log  *slog.Logger
	// Limit is module-events-max-bytes: the most of EVENTS one module may hold, its seats'
	// events included. Zero or less: no quota.
	Limit int64
	// EventsMaxAge is how long EVENTS keeps an event (for the refusal's hint).
	EventsMaxAge time.Duration
	// Rate and Burst pace each module's emits and jobs on this node (emit-rate); a
	// Rate of zero or less leaves them unpaced.
	Rate  float64
	Burst int
	// MaxLag is audit-max-lag: while a live member's audit log is more events than this behind
	// EVENTS, emits are refused with AdmitAuditBehind. Zero: no back-pressure.
	MaxLag uint64
	// Held is the bytes of EVENTS this node's audit log has recorded for a usage owner
	// ("mod.<module>", "seat.<seat>"), of events still younger than EVENTS' max age.
	Held func(owner string) int64
	// Owners are the usage owners whose events count against module's quota: its own
	// namespace and its seats'.
	Owners func(module string) []string
	// Flooding, if set, is told of a module that keeps sending far past its pace: the node
	// bars it for a while (its flood watch).
	Flooding func(module string, refused uint64)
	// JobsRefused, if set, is asked before a seat's job is passed on: a reason it returns
	// refuses the job at once with AdmitCutOff (a site whose link is down, where the job would
	// otherwise wait out the module's timeout for a queue it cannot reach).
	JobsRefused func() string
}

// Admitter takes what modules publish under manifest.AdmitPrefix and passes it on to its
// stream, or answers why not. Its state is per node: what this node admitted and its audit
// log has not recorded yet (pending), and each module's pace.
type Admitter struct {
	cfg     Config
	wire    atomic.Pointer[wire] // run swaps it when it connects again; Close closes it
	closing atomic.Bool
	done    chan struct{} // closed when run returns
	lag     atomic.Uint64 // the back-pressure's lag: SetLag
	// margin is sweepMargin (tests shorten it).
	margin time.Duration

	mu      sync.Mutex
	modules map[string]*moduleState
	// inflight is what was admitted and not yet recorded, by idKey of its x-event-id; order
	// is the same in admission order, for the sweep. Neither holds a string: what the
	// admitter keeps of an event is a few words the collector need not scan, and nothing
	// it allocates.
	inflight map[uint64]admitted
	order    []admittedID
	stored   int64 // the newest stream time the audit log recorded, Unix nanoseconds
	seed     maphash.Seed
}

type moduleState struct {
	pending int64
	// owners are Config.Owners of the module, asked again every ownersEvery: a seat
	// declared since counts from then on.
	owners   []string
	ownersAt time.Time
	pace     *rate.Limiter
	// overRate is the refusal for its pace, encoded once: a flood is refused tens of
	// thousands of times a second before the node bars it, all alike.
	overRate []byte
	refused  map[string]uint64 // by reason, since the node started
	flood    throttle.Window   // refusals for pace, a second at a time, to tell Flooding
}

type admitted struct {
	module *moduleState
	size   int64
}

type admittedID struct {
	key uint64
	at  int64 // Unix nanoseconds
}

// idKey is what inflight knows an event by: its x-event-id hashed. Two ids in flight at once
// with the same 64-bit hash would count one event's bytes once instead of twice until the
// log records them: at 100,000 in flight, about one chance in 10^9.
func (a *Admitter) idKey(id []byte) uint64 { return maphash.Bytes(a.seed, id) }

// Reasons of a refusal, as QuotaUse.Refused and the metrics count them.
const (
	ReasonQuota       = "quota"
	ReasonAuditBehind = "audit-behind"
	ReasonRate        = "rate"
	ReasonNotAdmitted = "not-admitted"
)

var reasons = []string{ReasonQuota, ReasonAuditBehind, ReasonRate, ReasonNotAdmitted}

// New connects and starts admitting.
func New(cfg Config) (*Admitter, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	a := &Admitter{cfg: cfg, margin: sweepMargin, done: make(chan struct{}), modules: map[string]*moduleState{}, inflight: map[uint64]admitted{}, seed: maphash.MakeSeed()}
	w, err := a.dial()
	if err != nil {
		return nil, err
	}
	a.wire.Store(w)
	go a.run()
	return a, nil
}

// dial connects the admitter's wire and subscribes.
func (a *Admitter) dial() (*wire, error) {
	conn, err := a.cfg.Dial()
	if err != nil {
		return nil, fmt.Errorf("admitter: connect: %w", err)
	}
	w, err := dialWire(conn, a.cfg.Key, "admitter", manifest.AdmitAll, QueueGroup, func(e string) {
		a.cfg.Log.Debug("admitter: the server says", "err", e) // a publish the permissions deny: a module's reply subject elsewhere than an inbox
	})
	if err != nil {
		return nil, fmt.Errorf("admitter: %w", err)
	}
	return w, nil
}

// Close stops admitting and waits for the admitter to end: what modules publish under their
// prefix has no responder on this node until another admitter (another node's) takes it.
func (a *Admitter) Close() error {
	a.closing.Store(true)
	a.wire.Load().close()
	<-a.done
	return nil
}

// run admits what the wire delivers until Close, connecting again if the server ends the
// connection (a burst it would not buffer for a slow reader, say).
func (a *Admitter) run() {
	defer close(a.done)
	retry := time.Duration(0)
	for {
		w := a.wire.Load()
		m, err := w.next()
		if err == nil {
			a.admit(w, m)
			if err = w.flushIfIdle(); err == nil {
				retry = 0
				continue
			}
		}
		if a.closing.Load() {
			return
		}
		a.cfg.Log.Warn("admitter: connection lost; connecting again (meanwhile this node's modules' emits have no responder: the sdk sends each again, with a back-off, for 5 s)", "err", err)
		for {
			retry = min(max(2*retry, 10*time.Millisecond), time.Second)
			time.Sleep(retry)
			if a.closing.Load() {
				return
			}
			w, err := a.dial()
			if err == nil {
				a.wire.Swap(w).close()
				if a.closing.Load() { // Close closed the old one: close this one too
					w.close()
					return
				}
				break
			}
			a.cfg.Log.Warn("admitter: connect again", "err", err)
		}
	}
}

// admit decides one message.
func (a *Admitter) admit(w *wire, m msg) {
	module, target, ok := manifest.AdmitOf(m.subject)
	if !ok {
		a.refuse(w, m, "", ReasonNotAdmitted, api.AdmitNotAdmitted, fmt.Sprintf("%s is not a subject the admitter takes: publish to mesh.admit.<module>.<event or job subject>", m.subject))
		return
	}
	event, job := kindOf(target)
	if !event && !job {
		a.refuse(w, m, module, ReasonNotAdmitted, api.AdmitNotAdmitted, fmt.Sprintf("%s is neither an event nor a seat's job: the admitter passes on only those", target))
		return
	}
	now := time.Now()
	a.mu.Lock()
	st := a.module(module)
	if st.pace != nil && !st.pace.AllowN(now, 1) {
		a.refusedLocked(module, st, ReasonRate, now)
		if st.overRate == nil {
			st.overRate, _ = json.Marshal(api.NewAdmitRefusal(api.AdmitOverRate, api.OverRateDescription(module, a.cfg.Rate)))
		}
		body := st.overRate
		a.mu.Unlock()
		answer(w, m, body)
		return
	}
	if !event {
		a.mu.Unlock()
		if a.cfg.JobsRefused != nil {
			if why := a.cfg.JobsRefused(); why != "" {
				a.refuse(w, m, module, "", api.AdmitCutOff, why)
				return
			}
		}
		a.pass(w, m, target)
		return
	}
	if lag := a.lag.Load(); a.cfg.MaxLag > 0 && lag > a.cfg.MaxLag {
		a.refusedLocked(module, st, ReasonAuditBehind, now)
		a.mu.Unlock()
		a.refuse(w, m, module, "", api.AdmitAuditBehind, fmt.Sprintf("the mesh's audit log is behind by %d events (audit-max-lag %d); retry", lag, a.cfg.MaxLag))
		return
	}
	rawID, wellFormed := headerValue(m.hdr, envelope.EventID)
	if !wellFormed || len(rawID) == 0 {
		// Passed on, a block nats.go cannot decode is an event a consumer gets without the
		// envelope it was sent with.
		a.refusedLocked(module, st, ReasonNotAdmitted, now)
		a.mu.Unlock()
		a.refuse(w, m, module, "", api.AdmitNotAdmitted, "an event carries its envelope in NATS headers (x-event-id, x-source, x-node, x-time, x-signature: DESIGN §4); this one has no x-event-id, or a header block that does not decode")
		return
	}
	size := storedSize(target, m)
	if a.cfg.Limit > 0 {
		if now.Sub(st.ownersAt) > ownersEvery {
			st.owners, st.ownersAt = a.cfg.Owners(module), now
		}
		held := a.held(st.owners)
		if used := held + st.pending; used+size > a.cfg.Limit {
			a.refusedLocked(module, st, ReasonQuota, now)
			a.mu.Unlock()
			a.refuse(w, m, module, "", api.AdmitOverQuota, fmt.Sprintf(
				"module %s holds %s of EVENTS and this event (%s) would pass its quota of %s: its emits are refused until its oldest events age out (events-max-age %s) or the operator raises module-events-max-bytes",
				module, config.Bytes(used), config.Bytes(size), config.Bytes(a.cfg.Limit), config.Duration(a.cfg.EventsMaxAge)))
			return
		}
	}
	if key := a.idKey(rawID); a.inflight[key].module == nil {
		st.pending += size
		a.inflight[key] = admitted{module: st, size: size}
		a.order = append(a.order, admittedID{key: key, at: now.UnixNano()})
	}
	a.mu.Unlock()
	a.pass(w, m, target)
}

// pass publishes m on target with m's reply subject, its header block and body as they came:
// the stream's PubAck goes straight to the module, and the admitter's hop is one message.
func (a *Admitter) pass(w *wire, m msg, target string) { w.publish(target, m.reply, m.hdr, m.data) }

// storedSize is envelope.StoredSize of m on target, from its header block: each header line
// "name: value\r\n" is the name, the value and 4 bytes, as the audit log counts it once
// nats.go has decoded the block (near enough: spaces around a value are trimmed there).
func storedSize(target string, m msg) int64 {
	n := len(target) + len(m.data)
	if i := bytes.Index(m.hdr, []byte("\r\n")); i >= 0 {
		n += len(m.hdr) - (i + 2) - 2 // less the version line and the empty line that ends the block
	}
	return int64(n)
}

// kindOf says whether target is an event's subject or a seat's job's. Cut, not
// manifest.SplitSubject: it runs for every event, and Cut allocates nothing.
func kindOf(target string) (event, job bool) {
	_, rest, _ := strings.Cut(target, ".")
	ns, rest, _ := strings.Cut(rest, ".")
	_, rest, ok := strings.Cut(rest, ".")
	if !ok {
		return false, false
	}
	switch ns {
	case "mod":
		return strings.HasPrefix(rest, "event."), false
	case "seat":
		if _, after, ok := strings.Cut(rest, "event."); ok && after != "" && manifest.IsEvent(target) {
			return true, false
		}
		return false, strings.Contains(rest, "accept.")
	}
	return false, false
}

// module returns module's state, made on first use. a.mu is held.
func (a *Admitter) module(module string) *moduleState {
	st := a.modules[module]
	if st == nil {
		st = &moduleState{refused: map[string]uint64{}}
		if a.cfg.Rate > 0 {
			st.pace = rate.NewLimiter(rate.Limit(a.cfg.Rate), max(a.cfg.Burst, 1))
		}
		a.modules[module] = st
	}
	return st
}

// ownersEvery is how long the admitter keeps a module's Owners.
const ownersEvery = time.Second

// held is what the audit log holds of the owners' events. a.mu is held; Held takes the
// audit log's own lock, never ours.
func (a *Admitter) held(owners []string) int64 {
	var n int64
	for _, owner := range owners {
		n += a.cfg.Held(owner)
	}
	return n
}

// refusedLocked counts a refusal; a module refused for its pace more than floodFactor times
// its pace within a second is reported to Flooding. a.mu is held.
func (a *Admitter) refusedLocked(module string, st *moduleState, reason string, now time.Time) {
	st.refused[reason]++
	if reason != ReasonRate || a.cfg.Flooding == nil {
		return
	}
	if flooded, n := st.flood.Refused(now, time.Second, int(floodRefusals(a.cfg.Rate))-1); flooded {
		go a.cfg.Flooding(module, uint64(n))
	}
}

// floodRefusals is how many refusals for its pace within a second make a module a flooder:
// its pace, and never fewer than 2,500. An sdk pipeline past its pace keeps to the pace its
// first refusals name (api.OverRatePace), or, shared with another sender, to the rate its own
// events are stored at, so it is not taken for one: refused about once for each event of its
// first window (TestAdmit_PacedNotBarred).
func floodRefusals(perSecond float64) uint64 { return uint64(max(2_500, perSecond)) }

// refuse answers m with a refusal, if it asked for an answer. reason, when not "", is counted
// for module (the other paths count under a.mu).
func (a *Admitter) refuse(w *wire, m msg, module, reason string, code int, description string) {
	if reason != "" && module != "" {
		a.mu.Lock()
		a.module(module).refused[reason]++
		a.mu.Unlock()
	}
	if m.reply == nil {
		return // nothing to encode for
	}
	b, _ := json.Marshal(api.NewAdmitRefusal(code, description))
	answer(w, m, b)
}

// answer sends refusal, encoded, to m's reply subject, if it asked for an answer.
func answer(w *wire, m msg, refusal []byte) {
	if m.reply != nil {
		w.publish(string(m.reply), nil, nil, refusal)
	}
}

// Recorded tells the admitter that the audit log recorded the events ids, the newest stored
// in EVENTS at newest: count makes their bytes count in Held, and they no longer count in
// pending, both at once for every admission (the race tier once saw a module refused for
// its quota at two thirds of it: the audit log had counted a batch in Held and not yet told
// the admitter).
func (a *Admitter) Recorded(ids []string, newest time.Time, count func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	count()
	a.stored = max(a.stored, newest.UnixNano())
	for _, id := range ids {
		key := maphash.String(a.seed, id)
		if e, ok := a.inflight[key]; ok {
			delete(a.inflight, key)
			e.module.pending -= e.size
		}
	}
}

// sweepMargin is how long after its admission an event is surely stored or surely not: more
// than a PubAck takes, and more than the clocks of two nodes differ.
const sweepMargin = 10 * time.Second

// Sweep forgets what was admitted and will never be recorded — a duplicate the stream
// dropped, a publish it refused: admitted more than sweepMargin before the newest event the
// audit log recorded (it records in stream order), or before now while caught up.
func (a *Admitter) Sweep(caughtUp bool) {
	now := time.Now().UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	i := 0
	for ; i < len(a.order); i++ {
		e := a.order[i]
		if sure := e.at + a.margin.Nanoseconds(); sure >= a.stored && !(caughtUp && sure < now) {
			break
		}
		if in, ok := a.inflight[e.key]; ok {
			delete(a.inflight, e.key)
			in.module.pending -= in.size
		}
	}
	a.order = append(a.order[:0], a.order[i:]...)
}

// SetLag sets the lag the back-pressure goes by: the largest among the live members' audit
// logs, in events.
func (a *Admitter) SetLag(lag uint64) { a.lag.Store(lag) }

// Lag is the lag SetLag set.
func (a *Admitter) Lag() uint64 { return a.lag.Load() }

// Use is each module's use of EVENTS against its quota, as this node sees it, for the
// modules given.
func (a *Admitter) Use(modules []string) []api.QuotaUse {
	out := make([]api.QuotaUse, 0, len(modules))
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range modules {
		u := api.QuotaUse{Module: m, Held: a.held(a.cfg.Owners(m)), Limit: max(a.cfg.Limit, 0), Refused: map[string]uint64{}}
		st := a.modules[m]
		for _, r := range reasons {
			u.Refused[r] = 0 // every reason, zero until refused: a rate needs the series
			if st != nil {
				u.Refused[r] = st.refused[r]
			}
		}
		if st != nil {
			u.Pending = st.pending
		}
		out = append(out, u)
	}
	return out
}

// Permissions are what the admitter's connection may do: take what modules publish under
// their prefix, pass events and jobs on to their streams, and answer refusals into inboxes.
// Nothing else: not the node's other subjects, not the JetStream API.
func Permissions() manifest.Permissions {
	return manifest.Permissions{
		Publish: slices.Concat([]string{"mesh.mod.*.event.>", "mesh.seat.*.event.>", "mesh.seat.*.*.event.>"},
			manifest.SeatJobPatterns(), []string{"_INBOX.>"}),
		Subscribe: []manifest.Subscription{{Subject: manifest.AdmitAll, Queue: QueueGroup}},
	}
}
