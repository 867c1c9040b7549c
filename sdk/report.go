package sdk

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/toolstats"
)

// reportEvery is how often the reporter looks whether to report: toolstats.Interval (tests
// shorten it).
var reportEvery = toolstats.Interval

// startReporting starts the reporter of the tools' latency: every toolstats.Interval in
// which a handler answered a call — and every toolstats.Heartbeat once it answered any, so
// that its node does not take it for gone — it publishes the instance's cumulative
// histograms to its node. Close sends the last report. It starts with the first tool the
// client serves (a module's or a seat's; nothing else is timed), once, and not once the
// client is closing; whether the module answers calls is asked at each report (a
// re-registration may take its tools away).
func (c *Client) startReporting() {
	c.closing.RLock()
	defer c.closing.RUnlock()
	if c.closed {
		return
	}
	c.reporting.Add(1)
	go func() {
		defer c.reporting.Done()
		t := time.NewTicker(reportEvery)
		defer t.Stop()
		var sent time.Time
		for {
			select {
			case <-c.ctx.Done():
				return
			case <-t.C:
				if c.report(time.Since(sent) >= toolstats.Heartbeat) {
					sent = time.Now()
				}
			}
		}
	}()
}

// report publishes the histograms if a call was answered since the last report, or, with
// anyway, if any call ever was; it reports whether it sent one.
func (c *Client) report(anyway bool) bool {
	self := c.declared()
	if !answersCalls(self) {
		return false // the bus would refuse the subject: it has no tools to time
	}
	tools, changed := c.stats.Snapshot()
	if len(tools) == 0 || !changed && !anyway {
		return false
	}
	node := c.node()
	b, err := json.Marshal(api.ToolStatsReport{Instance: c.instance, Node: node, Tools: tools})
	if err != nil || len(b) > toolstats.MaxBytes {
		c.log.Warn("the tools' latency report is not sent", "bytes", len(b), "err", err)
		return false
	}
	if err := c.nc.Publish(manifest.StatsSubject(self.Module, node), b); err != nil {
		c.log.Debug("the tools' latency report is not sent", "err", err)
		return false
	}
	return true
}

// answersCalls reports whether the module answers tool calls: its own tools, or a seat's it
// may hold (the bus grants its stats subjects to exactly these).
func answersCalls(self api.WhoamiReply) bool {
	return len(self.Tools) > 0 || slices.ContainsFunc(self.Seats, func(s api.SeatInfo) bool {
		return len(s.Serves) > 0 || slices.ContainsFunc(s.Versions, func(v api.SeatInfo) bool { return len(v.Serves) > 0 })
	})
}
