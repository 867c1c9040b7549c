package node

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/controller"
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
		Responder:         n.respNC,
		Gate:              n.gate,
		Registry:          n.reg,
		Quotas:            &n.quotas,
		Sign:              n.sign,
		Servers:           n.serverKey,
		Replicas:          n.replicas(),
		EventsMaxAge:      time.Duration(n.cfg.EventsMaxAge),
		Budget:            n.budget,
		ProvisionInterval: time.Duration(n.cfg.ProvisionInterval),
		Answered:          n.meter.answered,
		Publish: func(ctx context.Context, subject string, body []byte, causation string) error {
			return publishSigned(ctx, js, n.sign, n.id.Name, n.id.Name, subject, body, causation)
		},
		Changed: func(ctx context.Context, repository, before, commit string) ([]string, error) {
			ctx, cancel := context.WithTimeout(ctx, gitToolTimeout+5*time.Second)
			defer cancel()
			r, err := gitCall(ctx, n.bus.Conn(), "changed", ChangedRequest{Repository: repository, Before: before, Commit: commit})
			return r.Paths, err
		},
		Building: func(ctx context.Context) (module, cascade string) {
			var running BuilderStatus
			ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			if msg, err := n.bus.Conn().RequestWithContext(ctx, manifest.SeatToolSubject(BuilderSeat, "status"), nil); err == nil {
				json.Unmarshal(msg.Data, &running)
			}
			return running.Module, running.Cascade
		},
		Sources: func(ctx context.Context) error {
			if _, err := createSources(ctx, js, n.replicas()); err != nil {
				return fmt.Errorf("object store %s: %w", SourcesBucket, err)
			}
			return nil
		},
	})
}
