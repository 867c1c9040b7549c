package node

import (
	"context"
	"strings"
	"time"

	"github.com/meshnode/meshnode/controller"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
)

// newController makes the node's controller (package controller) from the node's bus, key,
// registry and quotas; the seat service starts it while this node holds mesh-controller.
func (n *Node) newController() *controller.Controller {
	js := n.bus.JetStream()
	return controller.New(controller.Config{
		Log:               n.log.With("component", "controller"),
		Node:              n.id.Name,
		Conn:              n.bus.Conn(),
		JS:                js,
		Responder:         n.resp.nc,
		Gate:              n.resp.gate,
		Registry:          n.reg,
		Quotas:            n.quotaUse,
		Sign:              n.sign,
		Servers:           n.serverKey,
		Replicas:          n.replicas,
		EventsMaxAge:      time.Duration(n.cfg.EventsMaxAge),
		Budget:            n.budget,
		ProvisionInterval: time.Duration(n.cfg.ProvisionInterval),
		Answered:          n.metrics.meter.Answered,
		Publish: func(ctx context.Context, subject string, body []byte, causation string) error {
			source, opts := n.id.Name, envelope.Options{Causation: causation}
			if ns, owner, rest, ok := manifest.SplitSubject(subject); ok && ns == "seat" && owner == manifest.ControllerSeat && strings.HasPrefix(rest, "event.") {
				// The controller's events carry the controller's identity and the lease's epoch,
				// signed by the node holding it, as the cascade's seats' do: the audit log checks
				// the signature against the holder of that lease.
				source, opts.SeatEpoch = manifest.ControllerSeat, n.seats.heldEpoch(manifest.ControllerSeat)
			}
			return publishSigned(ctx, js, n.sign, source, n.id.Name, subject, body, opts)
		},
	})
}
