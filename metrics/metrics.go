// Package metrics is the node's Prometheus registry: its counters and histograms (Meter),
// what the bus and its streams hold, read per scrape, and the latency the modules report of
// their own tools (ModuleTools).
package metrics

import (
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/embedbus"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// Config is what the node's registry reads at each scrape.
type Config struct {
	Started time.Time // when the node started
	Version string    // meshnode's version
	// Bus is the node's bus; nil while it is not open.
	Bus func() *embedbus.Bus
	// Audit is the audit log's record count and lag (its JetStream requests run per scrape).
	Audit func() (records, lag uint64)
	// AuditMissed counts the events the audit log never read: a counter, read without requests.
	AuditMissed func() uint64
	// AuditNotGenuine counts the records the audit log wrote that are not genuine events, by
	// kind, for each of AuditNotGenuineKinds.
	AuditNotGenuine      func() map[string]uint64
	AuditNotGenuineKinds []string
	// StoreBytes is the size of the node's bbolt file.
	StoreBytes func() int64
}

// NewRegistry builds the node's registry: no package globals, so nodes in one process keep
// separate counts.
func NewRegistry(cfg Config) *prometheus.Registry {
	started, bus, auditMissed, storeBytes := cfg.Started, cfg.Bus, cfg.AuditMissed, cfg.StoreBytes
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "meshnode_build_info",
			Help:        "Always 1; the labels carry the build.",
			ConstLabels: prometheus.Labels{"version": cfg.Version, "go_version": runtime.Version()},
		}, func() float64 { return 1 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshnode_uptime_seconds",
			Help: "Seconds since the node started.",
		}, func() float64 { return time.Since(started).Seconds() }),
		&busCollector{Bus: bus},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshnode_audit_records",
			Help: "Records kept in this node's audit log.",
		}, func() float64 { records, _ := cfg.Audit(); return float64(records) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshnode_audit_lag",
			Help: "Events in EVENTS not yet in this node's audit log (last sequence - audited sequence).",
		}, func() float64 { _, lag := cfg.Audit(); return float64(lag) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "meshnode_audit_missed_total",
			Help: "Events that left EVENTS before this node's audit log read them (evicted by the stream's per-subject cap or age limit while the log was behind, or deleted): gaps in the log.",
		}, func() float64 { return float64(auditMissed()) }),
		&notGenuineCollector{counts: cfg.AuditNotGenuine, kinds: cfg.AuditNotGenuineKinds},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshnode_store_bytes",
			Help: "Size of the node's bbolt file (identity, foundation, audit log).",
		}, func() float64 { return float64(storeBytes()) }),
	)
	return reg
}

// notGenuineCollector exposes meshnode_audit_not_genuine_total{kind}, every kind from zero.
type notGenuineCollector struct {
	counts func() map[string]uint64
	kinds  []string
}

var descNotGenuine = prometheus.NewDesc("meshnode_audit_not_genuine_total",
	"Events this node's audit log recorded that are not genuine, by kind as `meshnode audit verify` flags them (unsigned, unknown-source, bad-signature, source-mismatch, reused-id, bad-id): forged, misattributed or malformed events.",
	[]string{"kind"}, nil)

func (c *notGenuineCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descNotGenuine }

func (c *notGenuineCollector) Collect(ch chan<- prometheus.Metric) {
	var counts map[string]uint64
	if c.counts != nil {
		counts = c.counts()
	}
	for _, kind := range c.kinds {
		ch <- prometheus.MustNewConstMetric(descNotGenuine, prometheus.CounterValue, float64(counts[kind]), kind)
	}
}

var (
	descConnections = prometheus.NewDesc("meshnode_bus_connections", "Client connections to the node's bus, its own included.", nil, nil)
	descJSStreams   = prometheus.NewDesc("meshnode_jetstream_streams", "JetStream streams on this node.", nil, nil)
	descJSConsumers = prometheus.NewDesc("meshnode_jetstream_consumers", "JetStream consumers on this node.", nil, nil)
	descJSMessages  = prometheus.NewDesc("meshnode_jetstream_messages", "Messages stored by JetStream on this node.", nil, nil)
	descJSBytes     = prometheus.NewDesc("meshnode_jetstream_bytes", "Bytes stored by JetStream on this node.", nil, nil)
)

// busCollector reads the bus's counters once per scrape.
type busCollector struct{ Bus func() *embedbus.Bus }

func (c *busCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConnections, descJSStreams, descJSConsumers, descJSMessages, descJSBytes} {
		ch <- d
	}
}

func (c *busCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.Bus()
	if b == nil {
		return
	}
	st := b.Stats()
	ch <- prometheus.MustNewConstMetric(descConnections, prometheus.GaugeValue, float64(st.Connections))
	ch <- prometheus.MustNewConstMetric(descJSStreams, prometheus.GaugeValue, float64(st.Streams))
	ch <- prometheus.MustNewConstMetric(descJSConsumers, prometheus.GaugeValue, float64(st.Consumers))
	ch <- prometheus.MustNewConstMetric(descJSMessages, prometheus.GaugeValue, float64(st.Messages))
	ch <- prometheus.MustNewConstMetric(descJSBytes, prometheus.GaugeValue, float64(st.Bytes))
}

// Meter holds the node's counters and histograms, made with the node and registered with
// its metrics; each is labelled by what is bounded by the registry — a module, node or
// seat, a verb of the vault's — never by an event.
type Meter struct {
	events        *prometheus.CounterVec // by owner of the event's namespace
	eventBytes    *prometheus.CounterVec
	DeadLetters   *prometheus.CounterVec   // by stream and consumer
	DeadEvicted   *prometheus.CounterVec   // by stream and consumer
	DeadLost      *prometheus.CounterVec   // by stream and consumer
	holderChanges *prometheus.CounterVec   // by seat
	vacancy       prometheus.Histogram     // how long a seat was without a holder
	vault         *prometheus.CounterVec   // by verb and outcome
	tools         *prometheus.HistogramVec // the mesh's own seats' tools this node answered, by seat and tool
	Apply         prometheus.Histogram     // a host's applying of a declaration
	StartSeconds  prometheus.Gauge
	FormSeconds   prometheus.Gauge
	// SnapshotLast and SnapshotFailures are the scheduled snapshots' (snapshot.Schedule).
	SnapshotLast     prometheus.Gauge
	SnapshotFailures prometheus.Counter

	mu     sync.Mutex
	vacant map[string]time.Time // by lease key: since when the seat has had no holder
	holder map[string]string    // by lease key: the holding instance last seen
}

// vacancyMost bounds a vacancy the histogram records: a seat left free on purpose (its
// holder undeployed) and taken days later is no failover.
const vacancyMost = 10 * time.Minute

func NewMeter() *Meter {
	return &Meter{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshnode_events_total",
			Help: "Events this node's audit log took in, by the owner of their namespace (mod.<module>, node.<node> or seat.<seat>)."}, []string{"owner"}),
		eventBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshnode_event_bytes_total",
			Help: "Bytes of the events this node's audit log took in, by the owner of their namespace."}, []string{"owner"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshnode_dead_letters_total",
			Help: "Messages this node wrote to DEAD, by the stream and the consumer that gave them up."}, []string{"stream", "consumer"}),
		DeadEvicted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshnode_dead_letters_evicted_total",
			Help: "Dead letters this node removed from DEAD to keep their consumer within its share (dead-max-bytes-per-consumer), by stream and consumer."}, []string{"stream", "consumer"}),
		DeadLost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshnode_dead_letters_lost_total",
			Help: "Deaths whose letter this node did not write (DEAD could not take it, or the consumer's deaths came faster than DEAD took them), by stream and consumer."}, []string{"stream", "consumer"}),
		holderChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshnode_seat_holder_changes_total",
			Help: "New holders of a seat, as this node's watch of the leases saw them."}, []string{"seat"}),
		vacancy: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meshnode_seat_vacancy_seconds",
			Help:    "How long a seat was without a holder before the next took it (a failover, or a handoff).",
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 20, 30, 60}}),
		vault: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshnode_vault_requests_total",
			Help: "Requests the vault on this node took, by verb and outcome (ok, refused, rate_limited)."}, []string{"verb", "outcome"}),
		tools: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meshnode_tool_call_duration_seconds",
			Help:    "How long this node took to answer a tool of the mesh's own seats (mesh-controller, mesh-vault), from the request's arrival to the reply sent. Modules' tools go from caller to server without passing the node and are not measured here.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"seat", "tool"}),
		Apply: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meshnode_declaration_apply_duration_seconds",
			Help:    "How long this node took to apply a declaration: stop what it no longer runs, start what it now does.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30}}),
		StartSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshnode_start_duration_seconds",
			Help: "How long this node took to open, from its start until it was ready."}),
		FormSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshnode_formation_duration_seconds",
			Help: "How long this node waited for its mesh's servers before it started its bus (0: a single node)."}),
		SnapshotLast: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshnode_snapshot_last_success_timestamp_seconds",
			Help: "When this node last wrote a scheduled snapshot whole (Unix time; 0: none since it started holding mesh-controller, and none in snapshot-dir)."}),
		SnapshotFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshnode_snapshot_failures_total",
			Help: "Scheduled snapshots this node tried to write and did not (the log says why at warn)."}),
		vacant: map[string]time.Time{},
		holder: map[string]string{},
	}
}

func (m *Meter) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.events, m.eventBytes, m.DeadLetters, m.DeadEvicted, m.DeadLost, m.holderChanges, m.vacancy, m.vault, m.tools, m.Apply, m.StartSeconds, m.FormSeconds, m.SnapshotLast, m.SnapshotFailures}
}

// ingested counts the audit log's new events. A replay (owner replay.<consumer>) is an event
// counted when first emitted.
func (m *Meter) Ingested(owner string, events int, bytes int64) {
	if strings.HasPrefix(owner, "replay.") {
		return
	}
	m.events.WithLabelValues(owner).Add(float64(events))
	m.eventBytes.WithLabelValues(owner).Add(float64(bytes))
}

// holderChanged counts a seat's new holder and how long it stood empty.
func (m *Meter) HolderChanged(before, after *seats.Lease) {
	key := func(l *seats.Lease) string { return seats.Key(l.Seat, l.Scope, l.Node) }
	m.mu.Lock()
	defer m.mu.Unlock()
	if after == nil {
		m.vacant[key(before)] = time.Now()
		delete(m.holder, key(before))
		return
	}
	k, who := key(after), after.Module+"/"+after.Instance
	if m.holder[k] == who {
		return // the same holder seen again (the watch of the leases began anew)
	}
	m.holder[k] = who
	m.holderChanges.WithLabelValues(after.Seat).Inc()
	if since, ok := m.vacant[k]; ok {
		if d := time.Since(since); d <= vacancyMost {
			m.vacancy.Observe(d.Seconds())
		}
		delete(m.vacant, k)
	}
}

// vaultVerbs are the verbs the vault's metrics name; any other is "other".
var vaultVerbs = map[string]bool{api.VaultVerbMint: true, api.VaultVerbFetch: true, api.VaultVerbRotate: true, api.VaultVerbList: true,
	api.VaultVerbToken: true, api.VaultVerbEnrol: true, api.VaultVerbIdentity: true, api.VaultVerbServer: true, api.VaultVerbModule: true,
	api.VaultVerbIntake: true, api.VaultVerbProvision: true, api.VaultVerbUnprovision: true}

// served counts a vault request and times its answer.
func (m *Meter) Served(verb string, refused bool, took time.Duration) {
	if !vaultVerbs[verb] {
		verb = "other"
	}
	outcome := "ok"
	if refused {
		outcome = "refused"
	}
	m.vault.WithLabelValues(verb, outcome).Inc()
	m.tools.WithLabelValues(manifest.VaultSeat, verb).Observe(took.Seconds())
}

// answered times a tool of the controller's seat. tool is the subject's word after "tool."
// (whoami.<key> is whoami): bounded by the registry's tools, never by a caller.
func (m *Meter) Answered(subject string, took time.Duration) {
	_, tool, ok := strings.Cut(subject, ".tool.")
	if !ok {
		return
	}
	tool, _, _ = strings.Cut(tool, ".")
	m.tools.WithLabelValues(manifest.ControllerSeat, tool).Observe(took.Seconds())
}

// rateLimited counts a vault request dropped past the caller's rate limit.
func (m *Meter) RateLimited(verb string) {
	if !vaultVerbs[verb] {
		verb = "other"
	}
	m.vault.WithLabelValues(verb, "rate_limited").Inc()
}

var (
	descStreamMessages    = prometheus.NewDesc("meshnode_stream_messages", "Messages a stream holds on this node.", []string{"stream"}, nil)
	descStreamBytes       = prometheus.NewDesc("meshnode_stream_bytes", "Bytes a stream holds on this node.", []string{"stream"}, nil)
	descConsumerPending   = prometheus.NewDesc("meshnode_consumer_pending_messages", "Messages a durable consumer has not been delivered yet: its lag.", []string{"stream", "consumer"}, nil)
	descConsumerUnacked   = prometheus.NewDesc("meshnode_consumer_ack_pending_messages", "Messages a durable consumer was delivered and has not acknowledged.", []string{"stream", "consumer"}, nil)
	descConsumerRedelivd  = prometheus.NewDesc("meshnode_consumer_redelivered_messages", "Messages a durable consumer has had delivered more than once and not yet acknowledged.", []string{"stream", "consumer"}, nil)
	descConsumerDelivered = prometheus.NewDesc("meshnode_consumer_delivered_total", "Deliveries a durable consumer has made, redeliveries included (its consumer sequence, current on the consumer's leader: across a mesh take the max; a consumer made again starts over).", []string{"stream", "consumer"}, nil)
	descConsumerAcked     = prometheus.NewDesc("meshnode_consumer_acked_total", "Deliveries a durable consumer has had acknowledged, redeliveries included, up to its ack floor: how far a module has consumed (EVENTS' consumer is named after it); current on the consumer's leader: across a mesh take the max.", []string{"stream", "consumer"}, nil)
)

// StreamCollector reads the streams and durable consumers in-process once per scrape
// (ephemeral consumers, a watch's or a fetch's, come and go and are left out).
type StreamCollector struct{ Bus func() *embedbus.Bus }

func (c *StreamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStreamMessages, descStreamBytes, descConsumerPending, descConsumerUnacked, descConsumerRedelivd, descConsumerDelivered, descConsumerAcked} {
		ch <- d
	}
}

func (c *StreamCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.Bus()
	if b == nil {
		return
	}
	streams, err := b.Streams(true)
	if err != nil {
		return
	}
	for _, s := range streams {
		ch <- prometheus.MustNewConstMetric(descStreamMessages, prometheus.GaugeValue, float64(s.Messages), s.Name)
		ch <- prometheus.MustNewConstMetric(descStreamBytes, prometheus.GaugeValue, float64(s.Bytes), s.Name)
		for _, cs := range s.Consumers {
			if !cs.Durable {
				continue
			}
			ch <- prometheus.MustNewConstMetric(descConsumerPending, prometheus.GaugeValue, float64(cs.Pending), s.Name, cs.Name)
			ch <- prometheus.MustNewConstMetric(descConsumerUnacked, prometheus.GaugeValue, float64(cs.AckPending), s.Name, cs.Name)
			ch <- prometheus.MustNewConstMetric(descConsumerRedelivd, prometheus.GaugeValue, float64(cs.Redelivered), s.Name, cs.Name)
			ch <- prometheus.MustNewConstMetric(descConsumerDelivered, prometheus.CounterValue, float64(cs.Delivered), s.Name, cs.Name)
			ch <- prometheus.MustNewConstMetric(descConsumerAcked, prometheus.CounterValue, float64(cs.Acked), s.Name, cs.Name)
		}
	}
}

var (
	descModuleEventsBytes = prometheus.NewDesc("meshnode_module_events_bytes", "Bytes of EVENTS a module holds, its seats' events included, as this node's admitter counts them: what its audit log recorded (younger than events-max-age) and what it admitted since.", []string{"module"}, nil)
	descModuleEventsQuota = prometheus.NewDesc("meshnode_module_events_quota_bytes", "module-events-max-bytes: the most of EVENTS one module may hold (0: no quota).", nil, nil)
	descAdmitRefused      = prometheus.NewDesc("meshnode_admit_refused_total", "Events and jobs this node's admitter refused, by module and reason: quota (final), audit-behind and rate (retryable), not-admitted.", []string{"module", "reason"}, nil)
	descAdmitLag          = prometheus.NewDesc("meshnode_admit_audit_lag", "The audit lag the admitter's back-pressure goes by: the largest among the live members' audit logs, in events; emits are refused retryably while it is past audit-max-lag.", nil, nil)
)

// Admission reads the node's admitter once per scrape: each registered module's use of
// EVENTS against its quota, the admitter's refusals, and the lag its back-pressure goes by.
// A module holding nothing in EVENTS and never refused has no series.
type Admission struct {
	Use   func() []api.QuotaUse // nil entries: the admitter is not open yet
	Limit int64
	Lag   func() uint64
}

func (c *Admission) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descModuleEventsBytes, descModuleEventsQuota, descAdmitRefused, descAdmitLag} {
		ch <- d
	}
}

func (c *Admission) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descModuleEventsQuota, prometheus.GaugeValue, float64(c.Limit))
	ch <- prometheus.MustNewConstMetric(descAdmitLag, prometheus.GaugeValue, float64(c.Lag()))
	for _, u := range c.Use() {
		if u.Idle() {
			continue // a module that has sent nothing through the admitter: no series, at 10,000 modules
		}
		ch <- prometheus.MustNewConstMetric(descModuleEventsBytes, prometheus.GaugeValue, float64(u.Held+u.Pending), u.Module)
		for reason, n := range u.Refused { // every reason, zero until refused: rates need the series
			ch <- prometheus.MustNewConstMetric(descAdmitRefused, prometheus.CounterValue, float64(n), u.Module, reason)
		}
	}
}

// Sum is the total of every counter c collects, whatever their labels: what the console's
// charts read of the node's own counters, without a whole registry's Gather.
func Sum(c prometheus.Collector) uint64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var total float64
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) == nil && pb.Counter != nil {
			total += pb.Counter.GetValue()
		}
	}
	return uint64(total)
}

// Counts are the node's events and errors so far, as the console charts them: the events its
// audit log took in; the dead letters it wrote or lost, the emits its admitter refused (use)
// and the audit records that are not genuine events (notGenuine).
func (m *Meter) Counts(use []api.QuotaUse, notGenuine map[string]uint64) (events, errors uint64) {
	events, errors = Sum(m.events), Sum(m.DeadLetters)+Sum(m.DeadLost)
	for _, u := range use {
		errors += u.Refusals()
	}
	for _, n := range notGenuine {
		errors += n
	}
	return events, errors
}
