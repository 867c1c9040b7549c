package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
)

// benchTool is the tool the serving module declares.
const benchTool = "echo"

// ToolCallResult is the tool-call measurement: request/reply round trips to a module's tool
// served by sdk Serve, and to a plain subscriber on a plain subject, on the same server.
type ToolCallResult struct {
	// Calls is how many calls each side made.
	Calls int `json:"calls"`
	// PayloadBytes is the size of every request (the reply echoes it).
	PayloadBytes int `json:"payload_bytes"`
	// Mesh and Raw are the two sides.
	Mesh Series `json:"mesh"`
	Raw  Series `json:"raw"`
	// Ratio is Mesh.P50 / Raw.P50 (issue 20's target: ≤ 1.1).
	Ratio float64 `json:"ratio"`
	// RatioP99 is Mesh.P99 / Raw.P99.
	RatioP99 float64 `json:"ratio_p99"`
}

// ToolCall measures n round trips on each side, interleaved (mesh, raw, mesh, …) so that
// whatever else the machine does weighs on both alike.
func ToolCall(ctx context.Context, t Target, n int) (ToolCallResult, error) {
	s, err := OpenToolCall(ctx, t)
	if err != nil {
		return ToolCallResult{}, err
	}
	defer s.Close()
	mesh, raw, err := s.Both(ctx, n)
	if err != nil {
		return ToolCallResult{}, err
	}
	return newToolCallResult(n, mesh, raw), nil
}

func newToolCallResult(n int, mesh, raw Series) ToolCallResult {
	return ToolCallResult{Calls: n, PayloadBytes: PayloadSize, Mesh: mesh, Raw: raw,
		Ratio: ratio(float64(mesh.P50), float64(raw.P50)), RatioP99: ratio(float64(mesh.P99), float64(raw.P99))}
}

// ToolCallSession holds both sides of the tool-call measurement ready.
//
// The mesh side is a module T connected through the sdk, serving tool echo with Serve
// (queue group T, subject mesh.mod.T.tool.echo); the raw side is a second operator
// connection with a plain queue subscriber on bench.rawtool.<run>.echo answering with
// Respond. The caller of both is one more operator connection using nc.Request, one call at
// a time, with the same 256-byte body; both handlers echo the body.
type ToolCallSession struct {
	t      Target
	op     *nats.Conn // the caller
	server *sdk.Client
	module string

	rawConn *nats.Conn

	meshSubject, rawSubject string
	body                    []byte
}

// OpenToolCall registers and connects the serving module and starts the raw responder.
func OpenToolCall(ctx context.Context, t Target) (s *ToolCallSession, err error) {
	id := runID()
	s = &ToolCallSession{t: t, body: payload(id, 0, 0)}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.op, err = t.operator("bench-caller"); err != nil {
		return nil, err
	}
	module := "bench-t-" + id
	seed, err := t.register(ctx, s.op, "module: "+module+"\nrequires: [mesh-bus]\ntools: ["+benchTool+"]\n")
	if err != nil {
		return nil, err
	}
	s.module = module
	if s.server, err = connectModule(ctx, t, seed); err != nil {
		return nil, err
	}
	if err := s.server.Serve(benchTool, func(_ context.Context, r sdk.Request) ([]byte, error) {
		return r.Data, nil
	}); err != nil {
		return nil, err
	}
	s.meshSubject = manifest.ToolSubject(module, benchTool)

	if s.rawConn, err = t.operator("bench-raw-responder"); err != nil {
		return nil, err
	}
	s.rawSubject = "bench.rawtool." + id + "." + benchTool
	if _, err = s.rawConn.QueueSubscribe(s.rawSubject, "bench", func(m *nats.Msg) {
		m.Respond(m.Data)
	}); err != nil {
		return nil, fmt.Errorf("raw responder: %w", err)
	}
	if err := s.rawConn.Flush(); err != nil {
		return nil, fmt.Errorf("raw responder: %w", err)
	}
	return s, nil
}

// Raw makes n calls to the plain responder.
func (s *ToolCallSession) Raw(ctx context.Context, n int) (Series, error) {
	lat := make([]time.Duration, 0, n)
	for range n {
		d, err := s.call(ctx, s.rawSubject)
		if err != nil {
			return Series{}, err
		}
		lat = append(lat, d)
	}
	return newSeries(lat, sum(lat)), nil
}

// Both makes n calls on each side, alternating.
func (s *ToolCallSession) Both(ctx context.Context, n int) (mesh, raw Series, err error) {
	if n <= 0 {
		return mesh, raw, errors.New("no calls to make")
	}
	ml, rl := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for range n {
		d, err := s.call(ctx, s.meshSubject)
		if err != nil {
			return mesh, raw, err
		}
		ml = append(ml, d)
		if d, err = s.call(ctx, s.rawSubject); err != nil {
			return mesh, raw, err
		}
		rl = append(rl, d)
	}
	return newSeries(ml, sum(ml)), newSeries(rl, sum(rl)), nil
}

// call makes one timed request and checks the echo.
func (s *ToolCallSession) call(ctx context.Context, subject string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	start := time.Now()
	reply, err := s.op.RequestWithContext(ctx, subject, s.body)
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("call %s: %w", subject, err)
	}
	if !bytes.Equal(reply.Data, s.body) {
		return 0, fmt.Errorf("call %s: the reply is not the echo of the request (%d bytes, %q)", subject, len(reply.Data), reply.Header)
	}
	return d, nil
}

// Close stops both responders and removes the module.
func (s *ToolCallSession) Close() error {
	var errs []error
	if s.server != nil {
		errs = append(errs, s.server.Close())
	}
	if s.rawConn != nil {
		s.rawConn.Close()
	}
	if s.op != nil {
		if s.module != "" {
			errs = append(errs, s.t.remove(s.op, s.module))
		}
		s.op.Close()
	}
	return errors.Join(errs...)
}

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}
