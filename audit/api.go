package audit

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/nats-io/nats.go"
)

// The audit log is read through its node's tool, mesh.node.<node>.tool.audit, by the
// operator: client verbs never open the node's bbolt file.

// maxReply keeps an answer under NATS's default 1 MiB message size.
const maxReply = 900 << 10

// Serve answers the audit tool for l on nc.
func Serve(nc *nats.Conn, node string, l *Logger) (*nats.Subscription, error) {
	return nc.Subscribe(api.AuditToolSubject(node), func(m *nats.Msg) {
		var req api.AuditRequest
		var reply api.AuditReply
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
				// Its own goroutine: a verify of a large log takes a while, and another
				// asked meanwhile (only the operator may) tells its progress at once.
				go func() {
					var progress func(api.AuditProgress)
					if req.Progress {
						progress = func(p api.AuditProgress) {
							b, _ := json.Marshal(api.AuditReply{Progress: &p})
							m.Respond(b)
						}
					}
					v, err := l.VerifyProgress(progress)
					reply := api.AuditReply{Verification: &v}
					if err != nil {
						reply.Error = err.Error()
					}
					m.Respond(fit(reply))
				}()
				return
			default:
				reply.Error = fmt.Sprintf("unknown audit op %q: query or verify", req.Op)
			}
		}
		m.Respond(fit(reply))
	})
}

// elidedKeep bounds what an elided record keeps of each header value and of its event id and
// source: DefaultLimit elided records answer well under maxReply.
const elidedKeep = 256

// fit encodes reply within maxReply. A module may emit a body near the bus's 1 MiB limit, or
// many events with headers near JetStream's 64 KiB: the page holding them must still be
// readable, or one module would blind query and tail for everyone. The answer keeps every
// record — callers page until a short page — and leaves out the bulk of the largest first
// (the body, and what is over elidedKeep of each header), saying so in Elided. The stored
// record stays whole, and verify checks it.
func fit(reply api.AuditReply) []byte {
	b, _ := json.Marshal(reply)
	if len(b) <= maxReply {
		return b
	}
	recs := slices.Clone(reply.Records)
	sizes := make([]int, len(recs))
	order := make([]int, len(recs))
	for i, r := range recs {
		rb, _ := json.Marshal(r)
		sizes[i], order[i] = len(rb), i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(sizes[b], sizes[a]) })
	total := len(b)
	for _, i := range order {
		if total <= maxReply {
			break
		}
		recs[i] = elide(recs[i])
		rb, _ := json.Marshal(recs[i])
		total -= sizes[i] - len(rb)
	}
	reply.Records = recs
	if b, _ = json.Marshal(reply); len(b) <= maxReply {
		return b
	}
	b, _ = json.Marshal(api.AuditReply{Error: fmt.Sprintf("the answer is over the bus's message size even with %d records cut short: ask for fewer records (limit)", len(recs))})
	return b
}

// elide returns r without its body and with every header value, its event id and its source
// cut to elidedKeep bytes, saying what was left out.
func elide(r api.AuditRecord) api.AuditRecord {
	cut := func(s string) (string, int) {
		p := prefix(s, elidedKeep)
		return p, len(s) - len(p)
	}
	left := len(r.Body)
	h := make(map[string][]string, len(r.Headers))
	for k, vs := range r.Headers {
		k, n := cut(k)
		left += n
		for _, v := range vs {
			v, n := cut(v)
			h[k] = append(h[k], v)
			left += n
		}
	}
	var n1, n2 int
	r.EventID, n1 = cut(r.EventID)
	r.Source, n2 = cut(r.Source)
	r.Elided = fmt.Sprintf("%d bytes of body and headers left out to keep the answer under the bus's message size; the stored record is whole", left+n1+n2)
	r.Body, r.Headers = nil, h
	return r
}

// Call asks node's audit log over nc.
// CallProgress asks node's audit log as Call does, with the request's Progress set: each
// interim answer goes to progress, and the wait for the final one is bounded by idle between
// answers rather than by ctx's deadline alone, so a verify of any size completes.
func CallProgress(ctx context.Context, nc *nats.Conn, node string, req api.AuditRequest, idle time.Duration, progress func(api.AuditProgress)) (api.AuditReply, error) {
	var reply api.AuditReply
	req.Progress = true
	b, _ := json.Marshal(req)
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return reply, fmt.Errorf("audit: %w", err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(api.AuditToolSubject(node), inbox, b); err != nil {
		return reply, fmt.Errorf("audit: %w", err)
	}
	for {
		wait, cancel := context.WithTimeout(ctx, idle)
		msg, err := sub.NextMsgWithContext(wait)
		cancel()
		switch {
		case errors.Is(err, nats.ErrNoResponders) || err == nil && len(msg.Data) == 0 && msg.Header.Get("Status") == "503":
			return reply, fmt.Errorf("node %s does not answer its audit tool: is it running?", node)
		case err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			return reply, fmt.Errorf("audit: node %s said nothing for %s: is it still running? (meshnode status)", node, idle)
		case err != nil:
			return reply, fmt.Errorf("audit: %w", err)
		}
		reply = api.AuditReply{}
		if err := json.Unmarshal(msg.Data, &reply); err != nil {
			return reply, fmt.Errorf("audit answered %q: %w", msg.Data, err)
		}
		if reply.Progress != nil {
			if progress != nil {
				progress(*reply.Progress)
			}
			continue
		}
		if reply.Error != "" {
			return reply, errors.New(reply.Error)
		}
		return reply, nil
	}
}

func Call(ctx context.Context, nc *nats.Conn, node string, req api.AuditRequest) (api.AuditReply, error) {
	var reply api.AuditReply
	b, _ := json.Marshal(req)
	msg, err := nc.RequestWithContext(ctx, api.AuditToolSubject(node), b)
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
