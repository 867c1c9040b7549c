package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
)

// Defaults of Config, the figures `meshnode bench` runs with.
const (
	DefaultEvents   = 20000
	DefaultCalls    = 5000
	DefaultModules  = 1000
	DefaultConnects = 200
	DefaultRounds   = 3
)

// The targets of issue 4, printed beside the measured ratios; nothing enforces them.
const (
	TargetEmitOnRatio   = 0.65 // synchronous: mesh events/s ≥ 0.65 × raw JetStream (the signature is on the critical path)
	TargetToolCallRatio = 1.1  // mesh p50 round trip ≤ 1.1 × raw request/reply
	TargetConnectRatio  = 1.3  // sdk.Connect as the module ≤ 1.3 × a raw nkey connect
	TargetConnectGrowth = 1.15 // issue 37: sdk.Connect p50 with every module registered and connected ≤ 1.15 × with 2 registered
	// Pipelined (sdk.EmitAsync against raw async publishes): ≥ 0.8 × raw JetStream with one
	// more drained durable consumer (the least an audit log of every event costs the broker),
	// ≥ 0.65 × bare raw JetStream.
	TargetPipelinedAuditedRatio = 0.8
	TargetPipelinedRatio        = 0.65
	// Issue 41: against the floor the seed's cryptography sets (EmitOnResult.RawSigned), the
	// mesh one at a time ≥ 0.85 × the signed floor, and pipelined ≥ 1.0 × (batch verification
	// paying for everything else the mesh does).
	TargetSignedFloorRatio          = 0.85
	TargetPipelinedSignedFloorRatio = 1.0
	// Issue 41: the mesh's one-at-a-time p99 at most 1.5 × bare raw's.
	TargetP99Ratio = 1.5
)

// stall is how long a measurement waits without any event arriving before it calls the rest
// lost.
const stall = 10 * time.Second

// requestTimeout bounds one call or connect.
const requestTimeout = 10 * time.Second

// registerTimeout bounds one registration: the controller takes them one at a time, so one
// waits for those ahead of it, and a slow one is a figure (the registrations' p99) rather
// than the end of the run.
const registerTimeout = 30 * time.Second

// Target is the running node the measurements use. Run them against a throwaway node: they
// register modules (Connect leaves its modules registered) and write to JetStream.
type Target struct {
	// URL is the node's client URL (node.ClientURL()).
	URL string
	// OperatorSeed is the path of the operator's nkey seed, <data-dir>/operator.nk.
	OperatorSeed string
	// Dir is a directory the measurements write module seeds to; the caller removes it.
	Dir string
	// Replicas is the replication of the raw streams compared with the mesh's: the mesh's
	// own (3 in a mesh of three or more); zero means 1.
	Replicas int
	// Log receives progress (registrations, phases); nil discards it.
	Log *slog.Logger
	// Node is the node's process when it runs in one of its own; nil when it shares this
	// process (then the connect measurement neither weighs nor restarts it).
	Node Node
}

func (t Target) log() *slog.Logger {
	if t.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return t.Log
}

// operator opens a connection with the operator's key, which has every permission.
func (t Target) operator(name string) (*nats.Conn, error) {
	opt, err := nats.NkeyOptionFromSeed(t.OperatorSeed)
	if err != nil {
		return nil, fmt.Errorf("operator seed: %w", err)
	}
	nc, err := nats.Connect(t.URL, opt, nats.Name(name), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
		nats.CustomInboxPrefix(manifest.OperatorInbox)) // where modules' tools answer
	if err != nil {
		return nil, fmt.Errorf("connect to %s as the operator: %w", t.URL, err)
	}
	return nc, nil
}

// register registers manifest through op and writes the new module's seed into t.Dir.
func (t Target) register(ctx context.Context, op *nats.Conn, manifest string) (seedFile string, err error) {
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	reg, err := admin.Register(ctx, op, []byte(manifest))
	if err != nil {
		return "", fmt.Errorf("register: %w", err)
	}
	if !reg.Created {
		return "", fmt.Errorf("register %s: the module was already registered, so its seed is not ours to read", reg.Module)
	}
	seedFile = filepath.Join(t.Dir, reg.Module+".nk")
	if err := os.WriteFile(seedFile, reg.Seed, 0o600); err != nil {
		return "", err
	}
	return seedFile, nil
}

// remove unregisters module, best effort: it matters only on a node that outlives the run.
// Forced: a seat's declarer may go before the run's modules that use it.
func (t Target) remove(op *nats.Conn, module string) error {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	_, err := admin.Remove(ctx, op, api.RemoveRequest{Module: module, Force: true})
	return err
}

// runID returns 8 random hex digits: module, stream and subject names carry it, so runs on
// one node never meet.
func runID() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Config says how much each measurement does; a zero count skips that measurement.
type Config struct {
	// Events is the number of events of the emit→on measurement, on each side.
	Events int
	// Rounds is how many times emit→on compares the mesh with the signed floor, one at a
	// time and pipelined (EmitOn); zero means 1.
	Rounds int
	// Calls is the number of tool calls, on each side.
	Calls int
	// Modules is the number of modules registered before the connect measurement (≥ 2).
	Modules int
	// Connects is the number of connects timed, on each side, at each registry size.
	Connects int
}

// Results are the figures of Run; a nil member was skipped.
type Results struct {
	// CPUs are the CPUs the run had (the process's, which `meshnode bench --cpus` sets), and
	// GOMAXPROCS its Go processors.
	CPUs       int `json:"cpus"`
	GOMAXPROCS int `json:"gomaxprocs"`

	EmitOn   *EmitOnResult   `json:"emit_on,omitempty"`
	ToolCall *ToolCallResult `json:"tool_call,omitempty"`
	Connect  *ConnectResult  `json:"connect,omitempty"`
}

// Run runs every measurement cfg asks for against t, in the order emit→on, tool call,
// connect (the last registers cfg.Modules modules, which would weigh on the others).
func Run(ctx context.Context, t Target, cfg Config) (Results, error) {
	res := Results{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	if cfg.Events > 0 {
		t.log().Info("emit→on", "events", cfg.Events)
		r, err := EmitOn(ctx, t, cfg.Events, cfg.Rounds)
		if err != nil {
			return res, fmt.Errorf("emit→on: %w", err)
		}
		res.EmitOn = &r
	}
	if cfg.Calls > 0 {
		t.log().Info("tool call", "calls", cfg.Calls)
		r, err := ToolCall(ctx, t, cfg.Calls)
		if err != nil {
			return res, fmt.Errorf("tool call: %w", err)
		}
		res.ToolCall = &r
	}
	if cfg.Modules > 0 {
		connects := cfg.Connects
		if connects <= 0 {
			connects = DefaultConnects
		}
		r, err := Connect(ctx, t, cfg.Modules, connects)
		if err != nil {
			return res, fmt.Errorf("connect: %w", err)
		}
		res.Connect = &r
	}
	if res == (Results{}) {
		return res, errors.New("nothing to measure: every count is zero")
	}
	return res, nil
}
