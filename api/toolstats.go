package api

// ToolStatsReport is what a module's sdk publishes on manifest.StatsSubject(module) every
// toolstats.Interval: one instance's cumulative histograms since it connected, by tool (a
// module's tool by its name, a seat's as seat.<seat>.<tool>).
type ToolStatsReport struct {
	Instance string                   `json:"instance"`
	Node     string                   `json:"node"` // the node the instance is connected to
	Tools    map[string]ToolHistogram `json:"tools"`
}

// ToolHistogram is one tool's histogram: how many calls, their total duration in seconds,
// and how many took at most each of toolstats.Buckets' bounds (cumulative, as Prometheus
// counts them).
type ToolHistogram struct {
	Count   uint64   `json:"count"`
	Sum     float64  `json:"sum"`
	Buckets []uint64 `json:"buckets"`
}
