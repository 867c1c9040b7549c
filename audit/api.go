package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
)

// The audit log is read through its node's tool, mesh.node.<node>.tool.audit, by the
// operator: client verbs never open the node's bbolt file.

// maxReply keeps an answer under NATS's default 1 MiB message size.
const maxReply = 900 << 10

// ToolSubject is node's audit tool.
func ToolSubject(node string) string { return manifest.NodeToolSubject(node, "audit") }

// Request asks a node's audit log: Op "query" (with Filter) or "verify".
type Request struct {
	Op     string `json:"op"`
	Filter Filter `json:"filter"`
}

// Reply answers Request.
type Reply struct {
	Records      []Record      `json:"records,omitempty"`
	Verification *Verification `json:"verification,omitempty"`
	Error        string        `json:"error,omitempty"`
}

// Serve answers the audit tool for l on nc.
func Serve(nc *nats.Conn, node string, l *Logger) (*nats.Subscription, error) {
	return nc.Subscribe(ToolSubject(node), func(m *nats.Msg) {
		var req Request
		var reply Reply
		if err := json.Unmarshal(m.Data, &req); err != nil {
			reply.Error = "the request is not JSON"
		} else {
			switch req.Op {
			case "query":
				recs, err := l.Query(req.Filter)
				reply.Records = recs
				if err != nil {
					reply.Error = err.Error()
				}
			case "verify":
				v, err := l.Verify()
				reply.Verification = &v
				if err != nil {
					reply.Error = err.Error()
				}
			default:
				reply.Error = fmt.Sprintf("unknown audit op %q: query or verify", req.Op)
			}
		}
		b, _ := json.Marshal(reply)
		if len(b) > maxReply {
			b, _ = json.Marshal(Reply{Error: "the answer is over the bus's message size: ask for fewer records (limit)"})
		}
		m.Respond(b)
	})
}

// Call asks node's audit log over nc.
func Call(ctx context.Context, nc *nats.Conn, node string, req Request) (Reply, error) {
	var reply Reply
	b, _ := json.Marshal(req)
	msg, err := nc.RequestWithContext(ctx, ToolSubject(node), b)
	if errors.Is(err, nats.ErrNoResponders) {
		return reply, fmt.Errorf("node %s does not answer its audit tool: is it running?", node)
	}
	if err != nil {
		return reply, fmt.Errorf("audit: %w", err)
	}
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return reply, fmt.Errorf("audit answered %q: %w", msg.Data, err)
	}
	if reply.Error != "" {
		return reply, errors.New(reply.Error)
	}
	return reply, nil
}
