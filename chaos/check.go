package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Final is what the workload read from the mesh after healing: the state the history must
// explain. A node listed in Nodes but missing from a map below is an anomaly, so a read the
// workload forgot fails the run instead of passing it vacuously.
type Final struct {
	Nodes     []string            // every node; each must hold every acked event, secret and the newest revision
	Events    []string            // the event ids in EVENTS
	Audit     map[string][]string // node name -> the event ids in its audit log
	Consumers []string            // the modules that consume every emitted event
	// Sources, when set for a consumer, are the emitting modules (an emit op's Process) it
	// consumes; a consumer without is expected to get every acked event.
	Sources map[string][]string
	// Delivered is module -> the event ids the module reports it was delivered, with repeats:
	// for a module outside the test process, which records no "deliver" operations. Where a
	// module has both, they are two views of the same deliveries (the larger count is taken).
	Delivered map[string][]string
	// Vault is node name -> secret name -> the value the node read back.
	Vault map[string]map[string]string
	// Plaintext is node name -> the files in its data dir holding a secret's value in
	// plaintext, as ScanPlaintext finds them; a node missing from it was not scanned.
	Plaintext map[string][]string
	// Revisions is node name -> the declaration revision the node applied; NewestRevision is
	// the newest the controller declared, or Declared the newest it declared for each node
	// (a node's declarations are numbered on their own).
	Revisions      map[string]uint64
	NewestRevision uint64
	Declared       map[string]uint64
	// HealedAt is when the last fault was healed, ReadyAt when every node answered /readyz
	// again (zero: never), and ReadyBound how long after HealedAt that may take.
	HealedAt, ReadyAt time.Time
	ReadyBound        time.Duration
	// CatchUp is how long the consumers and the seat's holder took, once the loads stopped,
	// to have every acked event and job (Workload.Final); a run reports it.
	CatchUp time.Duration
}

// Bounds are what the checks allow; the zero value is the strictest.
type Bounds struct {
	// MaxDeliveries is how many times one module may be delivered one event. Zero means 1:
	// dedup (the sdk's replay window) promises exactly once. Raise it only where a redelivery
	// is the documented at-least-once case.
	MaxDeliveries int
	// Deliveries overrides MaxDeliveries for the modules it names: a module that does not
	// dedup (the plain-NATS example) may be delivered an event as often as its consumer
	// redelivers one whose ack was lost, up to the consumer's MaxDeliver — per consumer: one
	// deleted and made again (a "remake") between two deliveries counts from zero again.
	Deliveries map[string]int
	// MaxHandles is how many times one seat job may be handled (by any holder). Zero means 1.
	MaxHandles int
	// LeaseTTL is how long a lease surely lives after it is acquired or renewed: the seats'
	// TTL less the largest clock offset the nemesis gives meshnode's lease clock. Zero makes
	// no timing assumption: a lease may expire any time (see lease.go for what that misses).
	LeaseTTL time.Duration
	// LinearizeTimeout bounds porcupine's search per seat; zero means one minute.
	LinearizeTimeout time.Duration
}

// Anomaly is one violation a check found.
type Anomaly struct {
	Check string   // the check that found it
	Kind  string   // what kind of violation, finer than Check
	Keys  []string // the keys (event, job, seat, secret) it concerns, for the history slice
	Msg   string   // one sentence saying what is wrong
	Ops   []Op     // the operations that show it
}

// The checks, in the order Check runs them and the report prints them.
const (
	checkLost       = "lost"
	checkDuplicates = "duplicates"
	checkFencing    = "fencing"
	checkLeases     = "leases"
	checkVault      = "vault"
	checkDeploy     = "deploy"
	checkReady      = "ready"
)

// Check runs every check over the history's operations and the final reads.
func Check(ops []Op, f Final, b Bounds) *Report {
	if b.LinearizeTimeout == 0 {
		b.LinearizeTimeout = time.Minute
	}
	lc := leaseHistory(ops, b.LeaseTTL, b.LinearizeTimeout)
	r := &Report{ops: ops, lease: lc}
	r.add(checkLost, lost(ops, f))
	r.add(checkDuplicates, duplicates(ops, f, b))
	r.add(checkFencing, fencing(ops))
	r.add(checkLeases, lc.anomalies)
	r.add(checkVault, vault(ops, f))
	r.add(checkDeploy, deploy(ops, f))
	r.add(checkReady, ready(f))
	return r
}

// byKey indexes completed-OK operations of kind by key.
func byKey(ops []Op, kind string) map[string][]Op {
	out := map[string][]Op{}
	for _, op := range ops {
		if op.Kind == kind && op.OK {
			out[op.Key] = append(out[op.Key], op)
		}
	}
	return out
}

// set makes a set of ids.
func set(ids []string) map[string]bool {
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// lost finds acked events missing from EVENTS, from a consumer's deliveries or from a node's
// audit log, and acked seat jobs never handled.
func lost(ops []Op, f Final) []Anomaly {
	var out []Anomaly
	miss := func(kind, key, msg string, related []Op) {
		a := Anomaly{Check: checkLost, Kind: kind, Msg: msg, Ops: related}
		if key != "" {
			a.Keys = []string{key}
		}
		out = append(out, a)
	}
	delivered := map[string]map[string]bool{}
	for _, m := range f.Consumers {
		delivered[m] = set(f.Delivered[m])
	}
	for _, op := range ops {
		if op.Kind == "deliver" && op.OK && delivered[op.Process] != nil {
			delivered[op.Process][op.Key] = true
		}
	}
	inEvents := set(f.Events)
	audits := map[string]map[string]bool{}
	for _, n := range f.Nodes {
		if log, ok := f.Audit[n]; ok {
			audits[n] = set(log)
		} else {
			miss("audit-unread", n, fmt.Sprintf("node %s: its audit log was not read", n), nil)
		}
	}
	emits := byKey(ops, "emit")
	if len(emits) > 0 && len(f.Consumers) == 0 {
		miss("no-consumers", "", "acked events but Final.Consumers names no consuming module", nil)
	}
	if len(emits) > 0 && len(f.Nodes) == 0 {
		miss("no-nodes", "", "acked events but Final.Nodes names no node", nil)
	}
	for _, id := range sortedKeys(emits) {
		related := emits[id]
		if !inEvents[id] {
			miss("lost-from-stream", id, fmt.Sprintf("acked event %s is not in EVENTS", id), related)
		}
		for _, m := range f.Consumers {
			if src, ok := f.Sources[m]; ok && !slices.ContainsFunc(related, func(op Op) bool { return slices.Contains(src, op.Process) }) {
				continue // m does not consume what this event's emitter emits
			}
			if !delivered[m][id] {
				miss("undelivered", id, fmt.Sprintf("acked event %s was never delivered to module %s", id, m), related)
			}
		}
		for _, n := range f.Nodes {
			if a := audits[n]; a != nil && !a[id] {
				miss("lost-from-audit", id, fmt.Sprintf("acked event %s is not in node %s's audit log", id, n), related)
			}
		}
	}
	handled := byKey(ops, "handle")
	submits := byKey(ops, "submit")
	wipes := byKey(ops, "wipe")
	wiped := func(submit Op) bool { // a job stored before its queue was deleted went with it
		return slices.ContainsFunc(wipes[submit.Value], func(w Op) bool { return submit.InvokeMono < w.CompleteMono })
	}
	for _, id := range sortedKeys(submits) {
		if len(handled[id]) == 0 && !slices.ContainsFunc(submits[id], wiped) {
			miss("unhandled-job", id, fmt.Sprintf("acked seat job %s was never handled", id), submits[id])
		}
	}
	return out
}

// duplicates finds an event delivered to one module, or a seat job handled, more often than
// the bounds allow. The history's deliveries and Final.Delivered are two views of the same
// deliveries, so the larger count is taken, not their sum.
func duplicates(ops []Op, f Final, b Bounds) []Anomaly {
	maxDeliveries, maxHandles := max(b.MaxDeliveries, 1), max(b.MaxHandles, 1)
	type mk struct{ module, id string }
	seen := map[mk][]Op{}
	for _, op := range ops {
		if op.Kind == "deliver" && op.OK {
			k := mk{op.Process, op.Key}
			seen[k] = append(seen[k], op)
		}
	}
	final := map[mk]int{}
	for m, ids := range f.Delivered {
		for _, id := range ids {
			final[mk{m, id}]++
		}
	}
	keys := make([]mk, 0, len(seen)+len(final))
	for k := range seen {
		keys = append(keys, k)
	}
	for k := range final {
		if _, ok := seen[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].module < keys[j].module || keys[i].module == keys[j].module && keys[i].id < keys[j].id
	})
	remakes := byKey(ops, "remake")
	var out []Anomaly
	for _, k := range keys {
		allowed := maxDeliveries
		if d, ok := b.Deliveries[k.module]; ok {
			allowed = max(d, 1) * (1 + remadeBetween(remakes[k.module], seen[k]))
		}
		if n := max(len(seen[k]), final[k]); n > allowed {
			out = append(out, Anomaly{Check: checkDuplicates, Kind: "delivered-twice", Keys: []string{k.id}, Ops: seen[k],
				Msg: fmt.Sprintf("event %s delivered %d times to module %s (allowed %d)", k.id, n, k.module, allowed)})
		}
	}
	handled := byKey(ops, "handle")
	stale := staleHandles(ops)
	for _, id := range sortedKeys(handled) {
		hs := slices.DeleteFunc(slices.Clone(handled[id]), func(op Op) bool { return stale[op.Seq] })
		if n := len(hs); n > maxHandles {
			out = append(out, Anomaly{Check: checkDuplicates, Kind: "handled-twice", Keys: []string{id}, Ops: handled[id],
				Msg: fmt.Sprintf("seat job %s handled %d times (allowed %d)", id, n, maxHandles)})
		}
	}
	return out
}

// staleHandles are the handles a known defect of older meshnodes explains: a server that
// stopped gracefully freed its leases before it took its holders' authority away (every
// meshnode before the fix; an "unrevoked-stop" spans such a stop), so a holder connected to it
// went on being handed jobs until the server closed. A handle inside such a span, by an
// instance whose lease was on that server, under an epoch older than one acquired before the
// handle, whose effect the fence refused, is stale: it does not count toward MaxHandles. One
// whose effect was accepted (the next holder had not acted yet) counts like any other: the
// job took effect twice.
func staleHandles(ops []Op) map[int]bool {
	stops := byKey(ops, "unrevoked-stop")
	if len(stops) == 0 {
		return nil
	}
	nodeOf := map[string]string{} // instance → the server its lease was on
	var acquired []Op
	for _, op := range ops {
		if op.Kind == "acquire" && op.OK {
			nodeOf[op.Process] = op.Value
			acquired = append(acquired, op)
		}
	}
	// Each handle's effect is the next one its instance offered for its job at its epoch.
	type effect struct {
		instance, job string
		epoch         uint64
	}
	waiting := map[effect][]int{} // handles not yet paired, by their effect's key
	refused := map[int]bool{}     // handles whose effect the fence refused
	for _, op := range ops {
		switch k := (effect{op.Process, op.Key, op.Epoch}); {
		case op.Kind == "handle" && op.OK:
			waiting[k] = append(waiting[k], op.Seq)
		case op.Kind == "effect":
			k.job = op.Value
			if hs := waiting[k]; len(hs) > 0 {
				refused[hs[0]] = !op.OK && op.Err != ""
				waiting[k] = hs[1:]
			}
		}
	}
	out := map[int]bool{}
	for _, op := range ops {
		if op.Kind != "handle" || !op.OK || !refused[op.Seq] {
			continue
		}
		during := slices.ContainsFunc(stops[nodeOf[op.Process]], func(s Op) bool {
			return op.InvokeMono >= s.InvokeMono && op.InvokeMono <= s.CompleteMono
		})
		superseded := slices.ContainsFunc(acquired, func(a Op) bool { return a.Epoch > op.Epoch && a.InvokeMono <= op.InvokeMono })
		if during && superseded {
			out[op.Seq] = true
		}
	}
	return out
}

// remadeBetween counts the remakes that completed after the first of deliveries and before
// the last: each began a consumer that delivered the event again, its count from zero.
func remadeBetween(remakes, deliveries []Op) int {
	if len(deliveries) < 2 {
		return 0
	}
	first, last := deliveries[0].InvokeMono, deliveries[0].InvokeMono
	for _, d := range deliveries {
		first, last = min(first, d.InvokeMono), max(last, d.InvokeMono)
	}
	n := 0
	for _, r := range remakes {
		if r.CompleteMono > first && r.CompleteMono < last {
			n++
		}
	}
	return n
}

// fencing checks each fence's accepted effects in the order it accepted them: their epochs
// never decrease, a holder (instance, epoch) accepted again after another holder's effects
// began is two holders in overlapping epochs, and an epoch belongs to the instance that
// acquired it.
func fencing(ops []Op) []Anomaly {
	acquiredBy := map[string]map[uint64]string{} // seat -> epoch -> instance
	for _, op := range ops {
		if op.Kind == "acquire" && op.OK {
			if acquiredBy[op.Key] == nil {
				acquiredBy[op.Key] = map[uint64]string{}
			}
			acquiredBy[op.Key][op.Epoch] = op.Process
		}
	}
	type holder struct {
		instance string
		epoch    uint64
	}
	effects := byKey(ops, "effect") // each in history order: a Fence decides and records under one lock
	var out []Anomaly
	for _, fence := range sortedKeys(effects) {
		var cur holder
		var curOps []Op
		ended := map[holder]bool{}
		for _, op := range effects[fence] {
			h := holder{op.Process, op.Epoch}
			var why []string
			if op.Epoch == 0 {
				why = append(why, "carries no epoch")
			}
			if op.Epoch < cur.epoch {
				why = append(why, fmt.Sprintf("epoch %d accepted after epoch %d", op.Epoch, cur.epoch))
			}
			if h != cur && ended[h] {
				why = append(why, fmt.Sprintf("%s's effects (epoch %d) accepted again after %s's (epoch %d) began",
					h.instance, h.epoch, cur.instance, cur.epoch))
			} else if h != cur && h.epoch == cur.epoch && cur.instance != "" {
				why = append(why, fmt.Sprintf("%s and %s both accepted in epoch %d", cur.instance, h.instance, h.epoch))
			}
			if by, ok := acquiredBy[fence][op.Epoch]; ok && by != op.Process {
				why = append(why, fmt.Sprintf("epoch %d was acquired by %s", op.Epoch, by))
			}
			if len(why) > 0 {
				out = append(out, Anomaly{Check: checkFencing, Kind: "unfenced", Keys: []string{fence},
					Ops: append(slices.Clone(curOps[max(len(curOps)-3, 0):]), op),
					Msg: fmt.Sprintf("fence %s: effect %s by %s %s", fence, op.Value, op.Process, strings.Join(why, "; "))})
				continue // the holder before stays current: one stray effect is one anomaly
			}
			if h != cur {
				if cur.instance != "" {
					ended[cur] = true
				}
				cur, curOps = h, nil
			}
			curOps = append(curOps, op)
		}
	}
	return out
}

// vault checks that every node read back, for each secret with an acked write, the newest
// acked value or a later one. An acked write is superseded only by an acked write invoked after
// it completed; a write that failed or never completed may have taken effect at any time after
// its invocation, so it is never known to be superseded and its value is accepted.
func vault(ops []Op, f Final) []Anomaly {
	writes := map[string][]Op{}
	acked := map[string]bool{}
	for _, op := range ops {
		if op.Kind == "vault-write" {
			writes[op.Key] = append(writes[op.Key], op)
			acked[op.Key] = acked[op.Key] || op.OK
		}
	}
	var out []Anomaly
	for _, n := range f.Nodes {
		files, scanned := f.Plaintext[n]
		if !scanned && len(writes) > 0 {
			out = append(out, Anomaly{Check: checkVault, Kind: "plaintext-unscanned",
				Msg: fmt.Sprintf("node %s: its data dir was not scanned for secrets in plaintext (ScanPlaintext)", n)})
		}
		for _, file := range files {
			out = append(out, Anomaly{Check: checkVault, Kind: "plaintext",
				Msg: fmt.Sprintf("node %s: %s holds a secret's value in plaintext", n, file)})
		}
	}
	for _, secret := range sortedKeys(writes) {
		if !acked[secret] {
			continue // nothing was promised
		}
		ok := map[string]bool{}
		var newest Op
		for _, w := range writes[secret] {
			end := w.CompleteMono
			if !w.OK {
				end = math.MaxInt64
			}
			superseded := false
			for _, w2 := range writes[secret] {
				superseded = superseded || w2.OK && w2.InvokeMono > end
			}
			if !superseded {
				ok[w.Value] = true
			}
			if w.OK && w.CompleteMono >= newest.CompleteMono {
				newest = w
			}
		}
		for _, n := range f.Nodes {
			got, read := f.Vault[n][secret]
			switch {
			case !read:
				out = append(out, Anomaly{Check: checkVault, Kind: "vault-unread", Keys: []string{secret}, Ops: []Op{newest},
					Msg: fmt.Sprintf("node %s did not read back secret %s", n, secret)})
			case !ok[got]:
				out = append(out, Anomaly{Check: checkVault, Kind: "vault-stale", Keys: []string{secret}, Ops: writes[secret],
					Msg: fmt.Sprintf("node %s read secret %s = %q, want the newest acked %q or a later write", n, secret, got, newest.Value)})
			}
		}
	}
	return out
}

// minSecret is the shortest secret value ScanPlaintext looks for: a shorter one could match
// by chance.
const minSecret = 16

// ScanPlaintext returns the files under dataDir that hold, byte for byte, the value of any
// vault write in ops (acked or not: a write that failed may still have been stored). Secrets
// belong only in the files the host writes for a module (DESIGN §12): those in its secrets/
// directory and its provisions.json, readable by their owner alone; those are not read. Any
// other file is, the node's own store included. Values must be at least minSecret bytes (the
// workload's are random), else the scan refuses.
func ScanPlaintext(dataDir string, ops []Op) ([]string, error) {
	var values [][]byte
	for _, op := range ops {
		if op.Kind != "vault-write" {
			continue
		}
		if len(op.Value) < minSecret {
			return nil, fmt.Errorf("secret %s's value is %d bytes: write values of at least %d random bytes so a match is not chance",
				op.Key, len(op.Value), minSecret)
		}
		values = append(values, []byte(op.Value))
	}
	var found []string
	err := filepath.WalkDir(dataDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed since it was listed (a compacted block, a temporary file)
		}
		if err != nil {
			return err
		}
		moduleOwn := filepath.Base(filepath.Dir(path)) == "secrets" || d.Name() == "provisions.json"
		if moduleOwn && info.Mode().Perm()&0o077 == 0 {
			return nil
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if slices.ContainsFunc(values, func(v []byte) bool { return bytes.Contains(b, v) }) {
			found = append(found, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s for secrets in plaintext: %w", dataDir, err)
	}
	return found, nil
}

// deploy checks that every node applied the newest declaration, and that the revision a node
// reported applying never went back (a restarted node keeps its applied revision).
func deploy(ops []Op, f Final) []Anomaly {
	var deploys []Op
	applied := map[string][]Op{}
	for _, op := range ops {
		switch {
		case op.Kind == "deploy" && op.OK:
			deploys = append(deploys, op)
		case op.Kind == "applied" && op.OK:
			applied[op.Key] = append(applied[op.Key], op)
		}
	}
	var out []Anomaly
	for _, node := range sortedKeys(applied) {
		var prev Op
		var prevRev uint64
		for _, op := range applied[node] {
			rev, err := strconv.ParseUint(op.Value, 10, 64)
			if err != nil {
				out = append(out, Anomaly{Check: checkDeploy, Kind: "revision-unread", Keys: []string{node}, Ops: []Op{op},
					Msg: fmt.Sprintf("node %s: applied revision %q is not a number: record it in decimal", node, op.Value)})
				continue
			}
			if rev < prevRev {
				if op.InvokeMono > prev.CompleteMono { // overlapping reads may return in either order
					out = append(out, Anomaly{Check: checkDeploy, Kind: "revision-regressed", Keys: []string{node}, Ops: []Op{prev, op},
						Msg: fmt.Sprintf("node %s applied revision %d after %d", node, rev, prevRev)})
				}
				continue
			}
			prev, prevRev = op, rev
		}
	}
	last := deploys[max(len(deploys)-3, 0):]
	if f.Declared != nil {
		for _, n := range f.Nodes {
			rev, ok := f.Revisions[n]
			switch {
			case !ok || f.Declared[n] == 0:
				out = append(out, Anomaly{Check: checkDeploy, Kind: "revision-unread", Ops: last,
					Msg: fmt.Sprintf("node %s: its applied or declared revision was not read", n)})
			case rev != f.Declared[n]:
				out = append(out, Anomaly{Check: checkDeploy, Kind: "revision-behind", Ops: last,
					Msg: fmt.Sprintf("node %s applied revision %d, the newest declared for it is %d", n, rev, f.Declared[n])})
			}
		}
		return out
	}
	if f.NewestRevision == 0 {
		if len(deploys) > 0 {
			out = append(out, Anomaly{Check: checkDeploy, Kind: "revision-unread", Ops: last,
				Msg: "acked deploys but Final.NewestRevision is zero: read the controller's newest revision"})
		}
		return out
	}
	for _, n := range f.Nodes {
		rev, ok := f.Revisions[n]
		switch {
		case !ok:
			out = append(out, Anomaly{Check: checkDeploy, Kind: "revision-unread", Ops: last,
				Msg: fmt.Sprintf("node %s: its applied revision was not read", n)})
		case rev != f.NewestRevision:
			out = append(out, Anomaly{Check: checkDeploy, Kind: "revision-behind", Ops: last,
				Msg: fmt.Sprintf("node %s applied revision %d, the newest is %d", n, rev, f.NewestRevision)})
		}
	}
	return out
}

// ready checks that the mesh was ready again within the bound after the last fault healed.
func ready(f Final) []Anomaly {
	fail := func(msg string) []Anomaly { return []Anomaly{{Check: checkReady, Kind: "not-ready", Msg: msg}} }
	switch took := f.ReadyAt.Sub(f.HealedAt); {
	case f.HealedAt.IsZero() || f.ReadyBound <= 0:
		return fail("Final.HealedAt or Final.ReadyBound not set: record when the last fault healed and the bound")
	case f.ReadyAt.IsZero():
		return fail(fmt.Sprintf("the mesh was never ready again after healing at %s", f.HealedAt.Format(time.RFC3339Nano)))
	case took > f.ReadyBound:
		return fail(fmt.Sprintf("the mesh was ready %s after healing, beyond the bound %s", took.Round(time.Millisecond), f.ReadyBound))
	}
	return nil
}

// sortedKeys returns m's keys in order, so reports read the same run after run.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
