package node

import (
	"runtime"
	"time"

	"github.com/meshnode/meshnode/embedbus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// newMetrics builds the node's registry: no package globals, so nodes in one process keep
// separate counts.
func newMetrics(started time.Time, bus func() *embedbus.Bus, audit func() AuditStatus, storeBytes func() int64) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "meshnode_build_info",
			Help:        "Always 1; the labels carry the build.",
			ConstLabels: prometheus.Labels{"version": Version(), "go_version": runtime.Version()},
		}, func() float64 { return 1 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshnode_uptime_seconds",
			Help: "Seconds since the node started.",
		}, func() float64 { return time.Since(started).Seconds() }),
		&busCollector{bus: bus},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshnode_audit_records",
			Help: "Records kept in this node's audit log.",
		}, func() float64 { return float64(audit().Records) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshnode_audit_lag",
			Help: "Events in EVENTS not yet in this node's audit log (last sequence - audited sequence).",
		}, func() float64 { return float64(audit().Lag) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshnode_store_bytes",
			Help: "Size of the node's bbolt file (identity, foundation, audit log).",
		}, func() float64 { return float64(storeBytes()) }),
	)
	return reg
}

var (
	descConnections = prometheus.NewDesc("meshnode_bus_connections", "Client connections to the node's bus, its own included.", nil, nil)
	descJSStreams   = prometheus.NewDesc("meshnode_jetstream_streams", "JetStream streams on this node.", nil, nil)
	descJSConsumers = prometheus.NewDesc("meshnode_jetstream_consumers", "JetStream consumers on this node.", nil, nil)
	descJSMessages  = prometheus.NewDesc("meshnode_jetstream_messages", "Messages stored by JetStream on this node.", nil, nil)
	descJSBytes     = prometheus.NewDesc("meshnode_jetstream_bytes", "Bytes stored by JetStream on this node.", nil, nil)
)

// busCollector reads the bus's counters once per scrape.
type busCollector struct{ bus func() *embedbus.Bus }

func (c *busCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConnections, descJSStreams, descJSConsumers, descJSMessages, descJSBytes} {
		ch <- d
	}
}

func (c *busCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.bus()
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
