package chaos_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/chaos"
)

func TestHistory_Invoke(t *testing.T) {
	h := chaos.NewHistory()
	first := h.Invoke("sdk", "emit", "e1", "")
	second := h.Invoke("sdk", "emit", "e2", "")
	pending := h.Invoke("sdk", "emit", "e3", "")
	second.Done(errors.New("nats: timeout"))
	first.DoneEpoch(4, nil)
	first.Done(errors.New("a deferred Done after the real one"))

	ops := h.Ops()
	if got, want := len(ops), 3; got != want {
		t.Fatalf("len(Ops())=%d, want %d", got, want)
	}
	for i, op := range ops {
		if op.Seq != i {
			t.Errorf("ops[%d].Seq=%d, want invocation order", i, op.Seq)
		}
	}
	if op := ops[0]; !op.OK || op.Err != "" || op.Epoch != 4 || op.Pending() {
		t.Errorf("first = %+v, want OK with epoch 4: the first completion counts", op)
	}
	if op := ops[1]; op.OK || op.Err != "nats: timeout" || op.Pending() {
		t.Errorf("second = %+v, want failed with the timeout", op)
	}
	if op := ops[2]; !op.Pending() || op.OK {
		t.Errorf("third = %+v, want pending", op)
	}
	if a, b := ops[0], ops[1]; a.InvokeMono > b.InvokeMono || a.CompleteMono < b.CompleteMono || a.CompleteMono < a.InvokeMono {
		t.Errorf("monotonic times out of order: first %v..%v, second %v..%v", a.InvokeMono, a.CompleteMono, b.InvokeMono, b.CompleteMono)
	}
	if ops[0].Invoke.IsZero() || ops[0].Complete.IsZero() || !ops[2].Complete.IsZero() {
		t.Errorf("wall times: first %v..%v, pending completes at %v", ops[0].Invoke, ops[0].Complete, ops[2].Complete)
	}
	pending.Done(errors.New(""))
	if h.Ops()[2].Pending() {
		t.Errorf("an error with an empty message left the operation pending")
	}
}

func TestHistory_Concurrent(t *testing.T) {
	h := chaos.NewHistory()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				h.Invoke("p", "emit", "e", "").Done(nil)
				_ = h.Ops()
			}
		})
	}
	wg.Wait()
	for i, op := range h.Ops() {
		if op.Seq != i || !op.OK {
			t.Fatalf("ops[%d] = %+v, want Seq %d and OK", i, op, i)
		}
	}
}

// TestHistory_At: an operation seen after the fact keeps when it was invoked, on the
// history's clock, and completes when seen.
func TestHistory_At(t *testing.T) {
	h := chaos.NewHistory()
	stored := time.Now().Add(-300 * time.Millisecond) // a write another process made earlier
	op := h.At("n1", "renew", "ledger", "", stored)
	op.DoneEpoch(7, nil)
	got := h.Ops()[0]
	if !got.Invoke.Equal(stored) || got.CompleteMono-got.InvokeMono < 300*time.Millisecond || got.Epoch != 7 || !got.OK {
		t.Fatalf("At: %+v, want invoked at %s, 300 ms or more before it completed, epoch 7", got, stored)
	}
}
