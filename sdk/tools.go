package sdk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
)

// Header names of a tool's error reply, as the NATS micro framework writes them.
const (
	headerServiceError     = "Nats-Service-Error"
	headerServiceErrorCode = "Nats-Service-Error-Code"
)

// Request is one call of a tool.
type Request struct {
	Subject string
	Data    []byte
	Header  nats.Header
}

// ToolHandler answers a tool call. An error is sent to the caller as a tool error.
type ToolHandler func(ctx context.Context, r Request) ([]byte, error)

// ToolError is a tool's error reply.
type ToolError struct {
	Code    int
	Message string
}

func (e *ToolError) Error() string { return fmt.Sprintf("tool error %d: %s", e.Code, e.Message) }

// Serve answers one of the module's declared tools. Instances share the calls (queue group =
// the module). Calls are core request/reply: never persisted; a lost call is the caller's
// timeout.
func (c *Client) Serve(tool string, h ToolHandler) error {
	self := c.declared()
	if !slices.Contains(self.Tools, tool) {
		return fmt.Errorf("%w: module %s does not declare tool %q (it declares %v); add it to tools: in its manifest and re-register",
			ErrNotDeclared, self.Module, tool, self.Tools)
	}
	subject := manifest.ToolSubject(self.Module, tool)
	sub, err := c.nc.QueueSubscribe(subject, self.Module, c.toolResponder(tool, tool, h))
	if err != nil {
		return fmt.Errorf("serve %s: %w", tool, err)
	}
	if err := c.nc.Flush(); err != nil {
		return fmt.Errorf("serve %s: %w", tool, err)
	}
	if perr := c.refusal(subject); perr != nil {
		sub.Unsubscribe()
		return perr
	}
	c.mu.Lock()
	c.subs = append(c.subs, sub)
	c.mu.Unlock()
	return nil
}

// toolResponder answers each request of tool with h's reply, or its error as a service
// error header.
// Each call's time, from its arrival to its answer, is recorded under label (toolstats).
func (c *Client) toolResponder(tool, label string, h ToolHandler) nats.MsgHandler {
	c.reportOnce.Do(c.startReporting)
	return func(m *nats.Msg) {
		if !strings.HasPrefix(m.Reply, "_INBOX.") {
			// A call has an inbox to answer; a message without one is no caller's (a stream
			// consumer's delivery aimed at the tool, say), and is not handled.
			c.log.Warn("a tool message without an inbox to answer is ignored", "tool", tool, "reply", m.Reply)
			return
		}
		if !c.track() {
			return
		}
		defer c.wg.Done()
		start := time.Now()
		resp, err := serveOne(c.ctx, h, Request{Subject: m.Subject, Data: m.Data, Header: m.Header})
		c.stats.Observe(label, time.Since(start)) // before the answer: a caller answered is counted
		out := &nats.Msg{Data: resp, Header: nats.Header{}}
		if err != nil {
			out.Data = nil
			out.Header.Set(headerServiceError, err.Error())
			out.Header.Set(headerServiceErrorCode, "500")
		}
		if rerr := m.RespondMsg(out); rerr != nil {
			c.log.Warn("tool reply failed", "tool", tool, "err", rerr)
		}
	}
}

func serveOne(ctx context.Context, h ToolHandler, r Request) (resp []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("tool handler panicked: %v", p)
		}
	}()
	return h(ctx, r)
}

// Call calls tool of target and returns the reply. A module may call the tools of the seats
// it uses (and its own); target names the seat or module.
func (c *Client) Call(ctx context.Context, target, tool string, payload any) ([]byte, error) {
	self := c.declared()
	var subject string
	var shape *manifest.Shape
	switch {
	case target == self.Module:
		subject = manifest.ToolSubject(target, tool)
	case slices.ContainsFunc(self.Uses, func(s api.SeatInfo) bool { return s.Seat == target }):
		info, _ := c.usedSeat(ctx, target)
		if info.Scope != "" {
			if err := callable(info, tool); err != nil {
				return nil, err
			}
		}
		subject = manifest.SeatToolSubjectAt(target, info.Version, tool) // the pinned version
		shape = info.Shapes[tool]
	default:
		return nil, fmt.Errorf("%w: module %s may call the tools of the seats it uses, and %s is not one; add it to uses: in its manifest and re-register",
			ErrNotDeclared, self.Module, target)
	}
	body, err := encode(payload)
	if err != nil {
		return nil, err
	}
	if c.shapes {
		if err := checkShape(shape, "seat "+target+" tool "+tool, body); err != nil {
			return nil, err
		}
	}
	return c.request(ctx, subject, body, self.Module)
}

// request sends one tool call and maps the bus's answers to errors; a refused call fails at
// once with the bus's refusal.
func (c *Client) request(ctx context.Context, subject string, body []byte, source string) ([]byte, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ctx, stop := c.watch(ctx, subject)
	defer stop()
	msg := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	msg.Header.Set(envelope.Source, source)
	reply, err := c.nc.RequestMsgWithContext(ctx, msg)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("%w: nobody serves %s; is the module running, or the seat held?", ErrNoResponders, subject)
	case err != nil:
		if r := Refused(ctx); r != nil {
			return nil, fmt.Errorf("call %s: %w; does the manifest declare it (uses: or tools:), and is the module registered with that manifest?", subject, r)
		}
		return nil, fmt.Errorf("call %s: %w", subject, err)
	}
	if m := reply.Header.Get(headerServiceError); m != "" {
		code, _ := strconv.Atoi(reply.Header.Get(headerServiceErrorCode))
		return nil, &ToolError{Code: code, Message: m}
	}
	return reply.Data, nil
}
