package sdk

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/seats"
	"github.com/meshnode/meshnode/toolstats"
)

// startReporting starts the reporter of the tools' latency, for a module that answers calls:
// every toolstats.Interval in which a handler answered, and once more at Close, it publishes
// the instance's cumulative histograms on the module's stats subject for its node.
func (c *Client) startReporting() {
	if !answersCalls(c.declared()) {
		return // the bus would refuse the subject: it has no tools to time
	}
	c.reporting.Add(1)
	go func() {
		defer c.reporting.Done()
		t := time.NewTicker(toolstats.Interval)
		defer t.Stop()
		for {
			select {
			case <-c.ctx.Done():
				c.report()
				return
			case <-t.C:
				c.report()
			}
		}
	}()
}

// report publishes the histograms if a call was answered since the last report.
func (c *Client) report() {
	if !answersCalls(c.declared()) {
		return
	}
	tools, changed := c.stats.Snapshot()
	if !changed {
		return
	}
	b, err := json.Marshal(toolstats.Report{Instance: c.instance, Node: c.node(), Tools: tools})
	if err != nil || len(b) > toolstats.MaxBytes {
		c.log.Warn("the tools' latency report is not sent", "bytes", len(b), "err", err)
		return
	}
	if err := c.nc.Publish(manifest.StatsSubject(c.declared().Module), b); err != nil {
		c.log.Debug("the tools' latency report is not sent", "err", err)
	}
}

// answersCalls reports whether the module answers tool calls: its own tools, or a seat's it
// may hold (the bus grants its stats subject to exactly these).
func answersCalls(self registry.WhoamiReply) bool {
	return len(self.Tools) > 0 || slices.ContainsFunc(self.Seats, func(s seats.Info) bool {
		return len(s.Serves) > 0 || slices.ContainsFunc(s.Versions, func(v seats.Info) bool { return len(v.Serves) > 0 })
	})
}
