package chaos

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The lease history is checked against a register of one seat's lease with epochs. What each
// recorded operation proves decides what the check can catch — acquisitions alone are always
// linearizable, since any holder may have expired silently before the next one acquired:
//
//   - acquire (OK, epoch e): the instance created the lease; e is strictly greater than every
//     epoch before. Legal only if nobody holds it or the holder's lease may have expired.
//   - renew (OK): the instance still held the lease at epoch e at that instant (seats' renew is
//     a write at the expected revision: it fails with ErrLost if anyone took the lease). This
//     is the proof of possession that makes two holders at once illegal.
//   - release, lose: the holding ended (or had already ended). Seats' release succeeds even
//     when the lease was already taken, so a release proves nothing; both are always legal. A
//     release that failed or never completed may still have taken effect: it counts as one
//     that may take effect at any time after its invocation.
//
// Expiry is not an operation: nobody observes it, and a holder paused past its TTL does not
// know. Without a timing assumption (LeaseTTL zero) the model lets a lease expire at any
// moment, so two holders overlap only when the first proves possession (renews) after the
// second acquired. With LeaseTTL, a lease confirmed (acquired or renewed) by an operation
// invoked at t surely lives until t+LeaseTTL, and an acquisition that completed before then
// by anyone else is illegal: this catches a store that lets two acquire at once even when the
// first holder never renews again. A node restarted faster than the TTL deletes the leases it
// left behind (seats' takeOver): the watch sees that deletion as a release. A deletion the
// watch cannot have seen (it skipped revisions while its consumer was made again) is a lose
// of the holder of the moment that may take effect any time after the last revision seen.
//
// Failed and pending acquisitions and renewals are left out: a failed acquire that took
// effect silently only consumed an epoch and a holding nobody acts on, which the model's
// "expired at any time" (or the later epochs' "strictly greater") already admits.

// leaseInput is one lease operation as the model sees it.
type leaseInput struct {
	kind     string // acquire, renew, release, lose
	instance string
	seat     string
	epoch    uint64
	invoke   time.Duration // when it was invoked (monotonic)
	complete time.Duration // when it completed; math.MaxInt64 when it may take effect any time
}

// leaseState is the register: who holds it, at which epoch, until when it surely lives.
type leaseState struct {
	holder string // empty: nobody holds it
	epoch  uint64 // the holder's epoch
	max    uint64 // the greatest epoch ever acquired
	sure   time.Duration
}

// leaseModel is the porcupine model of a lease register; ttl is Bounds.LeaseTTL.
func leaseModel(ttl time.Duration) porcupine.Model {
	return porcupine.Model{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			bySeat := map[string][]porcupine.Operation{}
			var seats []string
			for _, op := range history {
				seat := op.Input.(leaseInput).seat
				if _, ok := bySeat[seat]; !ok {
					seats = append(seats, seat)
				}
				bySeat[seat] = append(bySeat[seat], op)
			}
			out := make([][]porcupine.Operation, 0, len(seats))
			for _, s := range seats {
				out = append(out, bySeat[s])
			}
			return out
		},
		Init: func() interface{} { return leaseState{} },
		Step: func(state, input, _ interface{}) (bool, interface{}) {
			return leaseStep(ttl, state.(leaseState), input.(leaseInput))
		},
		DescribeOperation: func(input, _ interface{}) string {
			in := input.(leaseInput)
			return fmt.Sprintf("%s %s %s epoch %d", in.instance, in.kind, in.seat, in.epoch)
		},
		DescribeState: func(state interface{}) string {
			s := state.(leaseState)
			if s.holder == "" {
				return fmt.Sprintf("free (max epoch %d)", s.max)
			}
			return fmt.Sprintf("%s holds epoch %d", s.holder, s.epoch)
		},
	}
}

// leaseStep is the register's sequential specification.
func leaseStep(ttl time.Duration, s leaseState, in leaseInput) (bool, leaseState) {
	holds := s.holder == in.instance && s.epoch == in.epoch
	switch in.kind {
	case "acquire":
		if in.epoch <= s.max {
			return false, s // epochs must grow strictly
		}
		if s.holder != "" && s.holder != in.instance && ttl > 0 && in.complete < s.sure {
			return false, s // the holder's lease cannot have expired yet
		}
		return true, leaseState{holder: in.instance, epoch: in.epoch, max: in.epoch, sure: in.invoke + ttl}
	case "renew":
		if !holds {
			return false, s
		}
		s.sure = max(s.sure, in.invoke+ttl)
		return true, s
	default: // release, lose
		if holds {
			s.holder, s.epoch, s.sure = "", 0, 0
		}
		return true, s
	}
}

// leaseOps turns the history's lease operations into porcupine's, keeping what they prove.
func leaseOps(ops []Op) []porcupine.Operation {
	clients := map[string]int{}
	var out []porcupine.Operation
	for _, op := range ops {
		in := leaseInput{kind: op.Kind, instance: op.Process, seat: op.Key, epoch: op.Epoch,
			invoke: op.InvokeMono, complete: op.CompleteMono}
		switch op.Kind {
		case "acquire", "renew":
			if !op.OK {
				continue
			}
		case "release", "lose":
			if !op.OK {
				in.complete = math.MaxInt64
			}
		default:
			continue
		}
		id, ok := clients[op.Process]
		if !ok {
			id = len(clients)
			clients[op.Process] = id
		}
		out = append(out, porcupine.Operation{ClientId: id, Input: in, Call: int64(in.invoke),
			Return: int64(in.complete), Metadata: op.Seq})
	}
	return out
}

// leaseCheck is the outcome of the lease history's check: an anomaly per seat whose history is
// not linearizable (or could not be decided in time), and what a visualization needs.
type leaseCheck struct {
	anomalies []Anomaly
	info      porcupine.LinearizationInfo // set only when there are anomalies
	model     porcupine.Model
}

// leaseHistory checks each seat's lease history for linearizability, each within timeout. A
// check that times out is an anomaly too: a run that cannot be decided proves nothing.
func leaseHistory(ops []Op, ttl, timeout time.Duration) leaseCheck {
	lc := leaseCheck{model: leaseModel(ttl)}
	bySeat := map[string][]Op{}
	for _, op := range ops {
		switch op.Kind {
		case "acquire", "renew", "release", "lose":
			bySeat[op.Key] = append(bySeat[op.Key], op)
		}
	}
	seats := make([]string, 0, len(bySeat))
	for s := range bySeat {
		seats = append(seats, s)
	}
	sort.Strings(seats)
	var failed []Op
	for _, seat := range seats {
		res := porcupine.CheckOperationsTimeout(lc.model, leaseOps(bySeat[seat]), timeout)
		if res == porcupine.Ok {
			continue
		}
		failed = append(failed, bySeat[seat]...)
		why := "not linearizable: two holders at once, or an epoch not greater than every one before"
		if res == porcupine.Unknown {
			why = fmt.Sprintf("undecided within %s (raise Bounds.LinearizeTimeout)", timeout)
		}
		lc.anomalies = append(lc.anomalies, Anomaly{Check: checkLeases, Kind: "lease", Keys: []string{seat},
			Ops: bySeat[seat], Msg: fmt.Sprintf("seat %s: lease history %s", seat, why)})
	}
	if len(failed) > 0 { // render only the seats that failed: the others would bury them
		_, lc.info = porcupine.CheckOperationsVerbose(lc.model, leaseOps(failed), timeout)
	}
	return lc
}
