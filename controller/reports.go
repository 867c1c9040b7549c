package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/internal/jsconsume"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// The controller's holder takes the jobs of the mesh-controller seat's `report` verb from
// the seat's work queue, as any holder takes its seat's jobs: a report is a host's apply
// outcome (DESIGN §7), and only a node hosts. Until the deploy path applies them, the holder
// checks each report — from a server of the mesh, signed by that server's key — and counts
// it; a report that fails the check is terminated, not retried. The bus lets no module
// publish one (manifest: a module sends work to none of the mesh's own seats but its own);
// the check here holds should a grant ever say otherwise.

// ReportVerb is the mesh-controller seat's accepted verb: a host's apply outcome.
const ReportVerb = "report"

// newReportCounts counts the controller's reports, by outcome.
func newReportCounts() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshnode_controller_reports_total",
		Help: "Report jobs the mesh-controller seat's holder on this node took from its work queue, by outcome (accepted, refused) and sender (node: a host's apply outcome; module: always refused, only a node reports).",
	}, []string{"outcome", "from"})
}

// errReportRefused marks a report that fails the holder's check.
var errReportRefused = errors.New("report refused")

// consumeReports takes report jobs from the controller's work queue until ctx ends: while
// this node holds mesh-controller.
func (c *Controller) consumeReports(ctx context.Context) {
	con, ok, err := manifest.Builtin().SeatConsumer(manifest.ControllerSeat, c.node)
	if err != nil || !ok {
		c.log.Error("the controller's work queue is not derived", "err", err)
		return
	}
	jsconsume.Run(ctx, jsconsume.Consumer{
		What:   "the controller's work queue " + con.Stream,
		Log:    c.log,
		Get:    func(ctx context.Context) (jetstream.Consumer, error) { return c.js.Consumer(ctx, con.Stream, con.Name) },
		Handle: c.takeReport,
	})
}

// takeReport checks one report job and keeps it (ack), or terminates it with the reason.
func (c *Controller) takeReport(m jetstream.Msg) {
	source, err := c.checkReport(m)
	from := "module"
	if _, ok := c.reg.Node(source); ok {
		from = "node"
	}
	if err != nil {
		c.reports.WithLabelValues("refused", from).Inc()
		c.log.Warn("report refused", "subject", m.Subject(), "source", source, "err", err)
		m.TermWithReason(err.Error())
		return
	}
	c.reports.WithLabelValues("accepted", from).Inc()
	if err := m.Ack(); err != nil {
		c.log.Warn("ack report", "source", source, "err", err)
	}
}

func (c *Controller) checkReport(m jetstream.Msg) (source string, err error) {
	ev, err := envelope.Read(m.Subject(), m.Headers(), m.Data())
	if err != nil {
		return "", fmt.Errorf("%w: %w", errReportRefused, err)
	}
	if id, ok := c.reg.Node(ev.Source); ok {
		// A host's apply outcome, signed by its node.
		if err := envelope.Verify(m.Headers(), m.Subject(), m.Data(), id.PublicKey); err != nil {
			return ev.Source, fmt.Errorf("%w: %w", errReportRefused, err)
		}
		var r host.Report
		if err := json.Unmarshal(m.Data(), &r); err != nil || r.Node != ev.Source {
			return ev.Source, fmt.Errorf("%w: not a host report of node %s", errReportRefused, ev.Source)
		}
		c.hostsMu.Lock()
		if old, ok := c.hosts[r.Node]; !ok || !r.Time.Before(old.Time) {
			c.hosts[r.Node] = r
		}
		c.hostsMu.Unlock()
		return ev.Source, nil
	}
	if _, ok := c.reg.Get(ev.Source); ok {
		return ev.Source, fmt.Errorf("%w: module %s sent a host report, which only a server of the mesh may (uses: [%s] lets it submit none)", errReportRefused, ev.Source, manifest.ControllerSeat)
	}
	return ev.Source, fmt.Errorf("%w: %s is no server of the mesh", errReportRefused, ev.Source)
}
