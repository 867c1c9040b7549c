package chaos

import (
	"fmt"
	"sync"
	"time"
)

// Op is one operation of the workload: what a process invoked and, once Done, how it ended.
// Kinds and the meaning of Key and Value per kind:
//
//   - "emit": Process = module, Key = event id; OK = the publish was acked.
//   - "deliver": Process = consuming module, Key = event id.
//   - "submit": Key = seat job id, Value = the seat; "handle": Key = job id, Epoch = the handler's lease epoch.
//   - "effect": a Fence's decision; Process = holder instance, Key = the fence (named after the
//     seat), Value = job id, Epoch = the effect's epoch; OK = accepted.
//   - "acquire", "renew", "release", "lose": the lease history; Process = holder instance,
//     Key = seat, Epoch = the lease epoch (see lease.go for what each one proves).
//   - "vault-write", "vault-read": Key = secret name, Value = its value.
//   - "register", "deploy": Key = module, Value = what was declared.
//   - "wipe": a seat's queue deleted under it (the nemesis's drift-stream), Key = the seat:
//     jobs submitted before it completed may be lost with the stream.
//   - "remake": a module's EVENTS consumer deleted under it (the nemesis's drift-consumer),
//     Key = the module: the consumer made again counts its deliveries from zero.
//   - "unrevoked-stop": a graceful stop of a server whose meshnode frees its leases before
//     it takes its holders' authority away (older meshnodes: see staleHandles), from SIGTERM
//     to its exit; Key = the server.
//   - "applied": a node's applied declaration revision as read from it (before a kill and
//     after the restart, say); Process = Key = node, Value = the revision in decimal.
type Op struct {
	Seq                       int    // position in invocation order, from 0
	Process, Kind, Key, Value string // see the kinds above
	Epoch                     uint64 // the lease epoch; zero when the kind has none
	Invoke, Complete          time.Time
	// InvokeMono and CompleteMono are monotonic times since the history began: wall times
	// jump with NTP, these do not, so ordering and the lease check use them.
	InvokeMono, CompleteMono time.Duration
	OK                       bool   // completed without error
	Err                      string // the error it completed with; empty when OK or not completed

	h *History
}

// History records the workload's operations; it is safe for concurrent use.
type History struct {
	start time.Time // carries a monotonic reading: time.Since(start) is monotonic

	mu  sync.Mutex
	ops []*Op
}

// NewHistory starts an empty history; its monotonic times count from now.
func NewHistory() *History {
	return &History{start: time.Now()}
}

// Invoke records that process invoked an operation of kind on key with value, and returns the
// operation to complete with Done or DoneEpoch. An operation never completed stays pending: its
// outcome is unknown, and the checkers treat it so.
func (h *History) Invoke(process, kind, key, value string) *Op {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	op := &Op{
		Seq: len(h.ops), Process: process, Kind: kind, Key: key, Value: value,
		Invoke: now, InvokeMono: now.Sub(h.start), h: h,
	}
	h.ops = append(h.ops, op)
	return op
}

// At is Invoke for an operation known to have been invoked at t, earlier than now: a write
// another process made, recorded when it was seen (a lease the bucket stored at t). t's wall
// time counts, against the history's start.
func (h *History) At(process, kind, key, value string, t time.Time) *Op {
	op := h.Invoke(process, kind, key, value)
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Invoke, op.InvokeMono = t, t.Round(0).Sub(h.start.Round(0))
	return op
}

// Span records an operation another party performed from invoke to complete, known only
// afterwards (a fault the nemesis injected): OK.
func (h *History) Span(process, kind, key, value string, invoke, complete time.Time) {
	op := h.At(process, kind, key, value, invoke)
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Complete, op.CompleteMono, op.OK = complete, complete.Round(0).Sub(h.start.Round(0)), true
}

// Maybe records an operation that may have taken effect at any time after t, or never: all
// the history knows is that it could have (a lease watch that skipped revisions). It stays
// pending.
func (h *History) Maybe(process, kind, key, value string, epoch uint64, t time.Time) {
	op := h.At(process, kind, key, value, t)
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Epoch = epoch
}

// Done completes the operation: OK when err is nil. Only the first completion counts, so a
// deferred Done after an explicit one is harmless.
func (op *Op) Done(err error) { op.DoneEpoch(op.Epoch, err) }

// DoneEpoch completes the operation with the lease epoch it ran under (an acquire learns its
// epoch only on completion).
func (op *Op) DoneEpoch(epoch uint64, err error) {
	now := time.Now()
	op.h.mu.Lock()
	defer op.h.mu.Unlock()
	if !op.Pending() {
		return
	}
	op.Epoch = epoch
	op.Complete, op.CompleteMono = now, now.Sub(op.h.start)
	op.OK = err == nil
	if err != nil {
		op.Err = err.Error()
		if op.Err == "" {
			op.Err = fmt.Sprintf("%T", err) // an empty message must not read as pending
		}
	}
}

// Pending reports whether the operation has not completed.
func (op Op) Pending() bool { return !op.OK && op.Err == "" }

// Ops returns a copy of the operations in invocation order.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Op, len(h.ops))
	for i, op := range h.ops {
		out[i] = *op
	}
	return out
}

// String renders the operation as one line of a history slice.
func (op Op) String() string {
	end := "pending"
	switch {
	case op.OK:
		end = fmt.Sprintf("ok @%s", op.CompleteMono.Round(time.Millisecond))
	case !op.Pending():
		end = fmt.Sprintf("err @%s: %s", op.CompleteMono.Round(time.Millisecond), op.Err)
	}
	s := fmt.Sprintf("#%d @%s %s %s %s", op.Seq, op.InvokeMono.Round(time.Millisecond), op.Process, op.Kind, op.Key)
	if op.Value != "" {
		s += "=" + op.Value
	}
	if op.Epoch != 0 {
		s += fmt.Sprintf(" epoch %d", op.Epoch)
	}
	return s + " -> " + end
}
