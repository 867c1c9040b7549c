package chaos

import (
	"errors"
	"fmt"
	"sync"
)

// errFenced is a refused effect's error in the history.
var errFenced = errors.New("fenced: an effect of a greater epoch was accepted before")

// Fence is the receiver of a seat's effects, as a resource guarded by fencing tokens is: it
// accepts an effect only with an epoch at least the highest it accepted. A holder paused past
// its lease may still act after another instance acquired a greater epoch; the fence refuses
// it, and the fencing check verifies that what was accepted never went back.
type Fence struct {
	h    *History
	name string

	mu      sync.Mutex
	highest uint64
}

// NewFence makes the receiver of the effects of the seat named name, recording its decisions
// in h as "effect" operations keyed by name.
func NewFence(h *History, name string) *Fence {
	return &Fence{h: h, name: name}
}

// Apply offers an effect (job is what it is about) by instance at epoch, and reports whether
// the fence accepted it. The decision is recorded under the fence's lock, so the history
// holds the effects in the order the fence decided them.
func (f *Fence) Apply(instance, job string, epoch uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := f.h.Invoke(instance, "effect", f.name, job)
	if epoch < f.highest {
		op.DoneEpoch(epoch, fmt.Errorf("%w: epoch %d below %d", errFenced, epoch, f.highest))
		return false
	}
	f.highest = epoch
	op.DoneEpoch(epoch, nil)
	return true
}

// Force accepts an effect without comparing epochs: a receiver without its fence
// (MutateUnfenced), for the run that shows the fencing check catches what it lets through.
func (f *Fence) Force(instance, job string, epoch uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.highest = max(f.highest, epoch)
	f.h.Invoke(instance, "effect", f.name, job).DoneEpoch(epoch, nil)
}
