package node

import (
	"context"
	"time"

	"github.com/meshnode/meshnode/controller"
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
		Replicas:          n.replicas(),
		EventsMaxAge:      time.Duration(n.cfg.EventsMaxAge),
		Budget:            n.budget,
		ProvisionInterval: time.Duration(n.cfg.ProvisionInterval),
		Answered:          n.metrics.meter.Answered,
		Publish: func(ctx context.Context, subject string, body []byte, causation string) error {
			return publishSigned(ctx, js, n.sign, n.id.Name, n.id.Name, subject, body, causation)
		},
	})
}
