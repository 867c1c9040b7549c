package node

import (
	"context"
	"encoding/json"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
)

// The status and members tools answer what /v1/status and /v1/members do, over the bus: an
// operator reaches a node by its client port and the operator's seed (`meshnode status
// --server`), while the HTTP API listens on loopback. They are served on the responder, so
// only inboxes hear the answers, and only admin identities may publish on a node's tools.

// serveStatus answers api.NodeToolStatus.
func (n *Node) serveStatus() (*nats.Subscription, error) {
	return n.resp.nc.Subscribe(manifest.NodeToolSubject(n.id.Name, api.NodeToolStatus), func(m *nats.Msg) {
		b, _ := json.Marshal(n.Status(context.Background())) // Status bounds its own waits
		m.Respond(b)
	})
}

// serveMembers answers api.NodeToolMembers.
func (n *Node) serveMembers() (*nats.Subscription, error) {
	return n.resp.nc.Subscribe(manifest.NodeToolSubject(n.id.Name, api.NodeToolMembers), func(m *nats.Msg) {
		b, _ := json.Marshal(api.NodeMembersReply{Members: n.Members()})
		m.Respond(b)
	})
}

// serveUIChallenge answers api.NodeToolUI with a login challenge of the node's dashboard.
func (n *Node) serveUIChallenge() (*nats.Subscription, error) {
	return n.resp.nc.Subscribe(manifest.NodeToolSubject(n.id.Name, api.NodeToolUI), func(m *nats.Msg) {
		ch := n.web.dash.NewChallenge()
		b, _ := json.Marshal(api.UIChallenge{Node: ch.Node, MeshID: ch.MeshID, Nonce: ch.Nonce, HTTPURL: n.HTTPURL()})
		m.Respond(b)
	})
}
