package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats.go/jetstream"
)

// The kinds of fault a Nemesis injects.
const (
	KindKill                = "kill"                  // SIGKILL one node, then start it again
	KindKillTwo             = "kill-two"              // SIGKILL two nodes at once
	KindPause               = "pause"                 // SIGSTOP one node for longer than a lease lives
	KindPartitionMajority   = "partition-majority"    // a minority cut from the majority
	KindIsolate             = "isolate"               // one node off the bridge, clients too
	KindBridge              = "bridge"                // two sides cut apart, one node seeing both
	KindKillDuringPartition = "kill-during-partition" // one node cut off, then one of the rest killed
	KindDriftConsumer       = "drift-consumer"        // a durable consumer of EVENTS deleted
	KindDriftStream         = "drift-stream"          // a seat's queue stream deleted
	KindDiskFull            = "disk-full"             // one node's data dir filled, then freed and the node restarted
)

// ownSeats are the mesh's own seats a kill aims at, and as many "" (a node drawn at random).
var ownSeats = []string{"mesh-controller", "mesh-vault", "", ""}

// Kinds are every kind, in the order a schedule's first round is drawn from.
var Kinds = []string{KindKill, KindKillTwo, KindPause, KindPartitionMajority, KindIsolate, KindBridge,
	KindKillDuringPartition, KindDriftConsumer, KindDriftStream, KindDiskFull}

// Fault is one fault the nemesis injected and healed.
type Fault struct {
	Kind string
	// Nodes are the nodes it hit (killed, paused, filled, cut off; for a bridge, the node
	// that sees both sides), by index in Cluster.Nodes.
	Nodes []int
	// Groups are a partition's sides.
	Groups [][]int
	// Target is what a drift deleted ("EVENTS/consumer" or a stream), or the seat whose
	// holder a kill aimed at.
	Target     string
	Start, End time.Time
}

func (f Fault) String() string {
	s := fmt.Sprintf("%s %s→%s", f.Kind, f.Start.Format("15:04:05.000"), f.End.Format("15:04:05.000"))
	if len(f.Nodes) > 0 {
		s += fmt.Sprintf(" nodes %v", f.Nodes)
	}
	if len(f.Groups) > 0 {
		s += fmt.Sprintf(" groups %v", f.Groups)
	}
	if f.Target != "" {
		s += " " + f.Target
	}
	return s
}

// Nemesis breaks a Cluster on a schedule drawn from a seed: the same seed, the same kinds
// on the same nodes in the same order. It injects one fault at a time (some are two at
// once), heals it, and waits until the mesh is Settled again before the next: so no
// more than two servers of five are ever down, paused or cut off — what a mesh of five
// survives — and a mesh of three or four loses one at most.
type Nemesis struct {
	c    *Cluster
	seed int64
	rng  *rand.Rand

	// Hold is the shortest a fault lasts (each lasts Hold to 2×Hold, drawn); 0 means 3 s.
	Hold time.Duration
	// Pause is how long a pause lasts; 0 means twice the lease TTL, so that the paused
	// node's leases expire under it.
	Pause time.Duration
	// Gap is the quiet time between a fault's end (the mesh ready) and the next; 0 means 1 s.
	Gap time.Duration
	// Recover bounds the wait for every member's /readyz after a fault; 0 means 2 minutes.
	Recover time.Duration
	// Cover, when set, makes Run go on past its duration until every kind has been
	// injected once (the first round), so a slow recovery cannot leave a kind out of a
	// short run; ctx still bounds it.
	Cover bool
	// Logf, when set, is told each fault as it starts and ends.
	Logf func(format string, args ...any)

	mu        sync.Mutex
	faults    []Fault
	consumers []string
	streams   []string
}

// NewNemesis is a nemesis for c whose schedule the seed decides.
func NewNemesis(c *Cluster, seed int64) *Nemesis {
	return &Nemesis{c: c, seed: seed, rng: rand.New(rand.NewPCG(uint64(seed), uint64(seed)>>32|0x9e3779b9))}
}

// DriftTargets names what the drift kinds may delete: durable consumers of EVENTS (named
// after their module) and streams (a seat's queue is SEAT_<seat>). Without them the nemesis
// deletes any consumer of EVENTS and any SEAT_ stream it finds.
func (nm *Nemesis) DriftTargets(consumers, streams []string) {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	nm.consumers, nm.streams = slices.Clone(consumers), slices.Clone(streams)
}

// targets are what DriftTargets named for a drift kind (nil: none, find one).
func (nm *Nemesis) targets(kind string) []string {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	if kind == KindDriftConsumer {
		return slices.Clone(nm.consumers)
	}
	return slices.Clone(nm.streams)
}

// Faults are the faults injected so far.
func (nm *Nemesis) Faults() []Fault {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	return slices.Clone(nm.faults)
}

// Counts are how many faults of each kind were injected, every kind listed (zero too).
func (nm *Nemesis) Counts() map[string]int {
	out := map[string]int{}
	for _, k := range Kinds {
		out[k] = 0
	}
	for _, f := range nm.Faults() {
		out[f.Kind]++
	}
	return out
}

// Run injects faults for d (a fault under way when d ends is finished, not cut short), or
// until ctx ends, then heals everything: resumes what is paused, starts what is killed,
// heals the network and frees the disks, and waits until the mesh is Settled. The first
// faults are every kind once, in an order the seed draws (kinds a mesh of fewer than five
// cannot survive are left out for it); the rest are drawn from every kind. With Cover, the
// first round is finished even when d has passed. The error is the first fault that could
// not be injected or healed, or a mesh not ready again.
func (nm *Nemesis) Run(ctx context.Context, d time.Duration) error {
	nm.defaults()
	deadline := time.Now().Add(d)
	owed := nm.firstRound()
	var err error
	for err == nil && ctx.Err() == nil && (time.Now().Before(deadline) || nm.Cover && nm.owes(owed)) {
		kind := nm.next(&owed)
		if kind == "" {
			break
		}
		err = nm.inject(ctx, kind)
		if err == nil {
			err = nm.awaitReady(ctx)
		}
		if err == nil {
			nm.sleep(ctx, nm.Gap)
		}
	}
	// Healing runs even when ctx has ended.
	if herr := nm.healAll(context.WithoutCancel(ctx)); err == nil {
		err = herr
	}
	return err
}

func (nm *Nemesis) defaults() {
	if nm.Hold == 0 {
		nm.Hold = 3 * time.Second
	}
	if nm.Pause == 0 {
		nm.Pause = 2 * seats.DefaultTTL
	}
	if nm.Gap == 0 {
		nm.Gap = time.Second
	}
	if nm.Recover == 0 {
		nm.Recover = 2 * time.Minute
	}
}

// firstRound is every kind once, in an order the seed draws.
func (nm *Nemesis) firstRound() []string {
	owed := slices.Clone(Kinds)
	nm.rng.Shuffle(len(owed), func(i, j int) { owed[i], owed[j] = owed[j], owed[i] })
	return owed
}

// owes reports whether a kind of the first round is still owed that the mesh can take now.
func (nm *Nemesis) owes(owed []string) bool {
	return slices.ContainsFunc(owed, nm.possible)
}

// next takes the next kind owed (one the mesh can take now), or draws one.
func (nm *Nemesis) next(owed *[]string) string {
	for i, k := range *owed {
		if nm.possible(k) {
			*owed = slices.Delete(*owed, i, i+1)
			return k
		}
	}
	var can []string
	for _, k := range Kinds {
		if nm.possible(k) {
			can = append(can, k)
		}
	}
	if len(can) == 0 {
		return ""
	}
	return can[nm.rng.IntN(len(can))]
}

// possible reports whether the mesh's members survive kind: two at once need five.
func (nm *Nemesis) possible(kind string) bool {
	n := len(nm.c.Members())
	switch kind {
	case KindKillTwo, KindKillDuringPartition:
		return n >= 5
	default:
		return n >= 3
	}
}

// pick draws k distinct members.
func (nm *Nemesis) pick(k int) []int {
	m := nm.c.Members()
	nm.rng.Shuffle(len(m), func(i, j int) { m[i], m[j] = m[j], m[i] })
	return m[:k]
}

func (nm *Nemesis) hold(ctx context.Context) {
	nm.sleep(ctx, nm.Hold+time.Duration(nm.rng.Int64N(int64(nm.Hold))))
}

// sleep waits d or until ctx ends: the schedule's own time, not a wait for a state.
func (nm *Nemesis) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (nm *Nemesis) logf(format string, args ...any) {
	if nm.Logf != nil {
		nm.Logf(format, args...)
	}
}

// inject injects one fault of kind, holds it and heals it, and records it.
func (nm *Nemesis) inject(ctx context.Context, kind string) error {
	c := nm.c
	f := Fault{Kind: kind, Start: time.Now()}
	var err error
	switch kind {
	case KindKill, KindKillTwo:
		f.Nodes = nm.pick(map[string]int{KindKill: 1, KindKillTwo: 2}[kind])
		// Half the single kills go to the holder of the controller's or the vault's seat:
		// the nodes whose loss costs the mesh most. Who holds it is the mesh's, not the seed's.
		if kind == KindKill {
			if seat := ownSeats[nm.rng.IntN(len(ownSeats))]; seat != "" {
				if i, herr := c.Holder(seat); herr == nil {
					f.Nodes, f.Target = []int{i}, "holder of "+seat
				}
			}
		}
		nm.logf("nemesis: %s %v", kind, f.Nodes)
		err = nm.each(f.Nodes, (*Node).Kill)
		if err == nil {
			nm.hold(ctx)
			err = nm.each(f.Nodes, (*Node).Start)
		}
	case KindPause:
		f.Nodes = nm.pick(1)
		nm.logf("nemesis: %s %v for %s", kind, f.Nodes, nm.Pause)
		err = nm.each(f.Nodes, (*Node).Pause)
		if err == nil {
			nm.sleep(ctx, nm.Pause)
			err = nm.each(f.Nodes, (*Node).Resume)
		}
	case KindPartitionMajority:
		m := nm.pick(len(c.Members()))
		minority := m[:len(m)/2]
		f.Nodes, f.Groups = minority, [][]int{minority, m[len(m)/2:]}
		err = nm.partition(ctx, kind, f.Groups)
	case KindIsolate:
		f.Nodes = nm.pick(1)
		nm.logf("nemesis: %s %v", kind, f.Nodes)
		err = c.Isolate(f.Nodes[0])
		if err == nil {
			nm.hold(ctx)
			err = c.Heal()
		}
	case KindBridge:
		m := nm.pick(len(c.Members()))
		rest := m[1:]
		f.Nodes, f.Groups = m[:1], [][]int{rest[:len(rest)/2], rest[len(rest)/2:]}
		err = nm.partition(ctx, kind, f.Groups)
	case KindKillDuringPartition:
		m := nm.pick(len(c.Members()))
		cut, killed := m[0], m[1]
		f.Nodes, f.Groups = []int{cut, killed}, [][]int{{cut}, m[1:]}
		nm.logf("nemesis: %s: %v cut off, then %d killed", kind, cut, killed)
		err = c.Partition(f.Groups...)
		if err == nil {
			nm.hold(ctx)
			err = c.Nodes[killed].Kill()
		}
		if err == nil {
			nm.hold(ctx)
			err = c.Nodes[killed].Start()
		}
		if err == nil {
			nm.hold(ctx)
			err = c.Heal()
		}
	case KindDriftConsumer, KindDriftStream:
		f.Target, err = nm.drift(ctx, kind)
		if err == nil {
			nm.logf("nemesis: %s %s", kind, f.Target)
			nm.hold(ctx)
		}
	case KindDiskFull:
		f.Nodes = nm.pick(1)
		nm.logf("nemesis: %s %v", kind, f.Nodes)
		err = c.FillDisk(f.Nodes[0])
		if err == nil {
			nm.hold(ctx)
			err = nm.freeDisk(f.Nodes[0])
		}
	default:
		err = fmt.Errorf("chaos: no fault of kind %q; the kinds are %v", kind, Kinds)
	}
	f.End = time.Now()
	nm.mu.Lock()
	nm.faults = append(nm.faults, f)
	nm.mu.Unlock()
	if err != nil {
		return fmt.Errorf("nemesis: %s: %w", f, err)
	}
	nm.logf("nemesis: healed %s", f)
	return nil
}

// freeDisk frees node i's disk and restarts the node: nats-server disables JetStream for
// good on a write error (the full disk), and only a restart enables it again — what an
// operator does once the disk has room. The node is restarted whether or not a write hit
// the full disk, so that a seed's schedule does not depend on it.
func (nm *Nemesis) freeDisk(i int) error {
	n := nm.c.Nodes[i]
	if err := nm.c.FreeDisk(i); err != nil {
		return err
	}
	if err := n.Kill(); err != nil {
		return err
	}
	return n.Start()
}

func (nm *Nemesis) partition(ctx context.Context, kind string, groups [][]int) error {
	nm.logf("nemesis: %s %v", kind, groups)
	if err := nm.c.Partition(groups...); err != nil {
		return err
	}
	nm.hold(ctx)
	return nm.c.Heal()
}

func (nm *Nemesis) each(nodes []int, f func(*Node) error) error {
	var errs []error
	for _, i := range nodes {
		errs = append(errs, f(nm.c.Nodes[i]))
	}
	return errors.Join(errs...)
}

// drift deletes one of the drift targets (or one found) through the operator's
// connection, and returns what it deleted.
func (nm *Nemesis) drift(ctx context.Context, kind string) (string, error) {
	nc, err := nm.c.Connect()
	if err != nil {
		return "", err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	consumers, streams := nm.targets(KindDriftConsumer), nm.targets(KindDriftStream)
	if kind == KindDriftConsumer {
		if len(consumers) == 0 {
			stream, err := js.Stream(ctx, manifest.EventsStreamName)
			if err != nil {
				return "", fmt.Errorf("find a consumer to delete: %w", err)
			}
			for name := range stream.ConsumerNames(ctx).Name() {
				consumers = append(consumers, name)
			}
		}
		if len(consumers) == 0 {
			return "", fmt.Errorf("EVENTS has no consumer to delete: register a module that consumes, or name one with DriftTargets")
		}
		slices.Sort(consumers)
		name := consumers[nm.rng.IntN(len(consumers))]
		target := manifest.EventsStreamName + "/" + name
		if err := js.DeleteConsumer(ctx, manifest.EventsStreamName, name); err != nil {
			return target, fmt.Errorf("delete consumer %s: %w", target, err)
		}
		return target, nil
	}
	if len(streams) == 0 {
		for name := range js.StreamNames(ctx).Name() {
			if strings.HasPrefix(name, manifest.SeatStreamName("")) {
				streams = append(streams, name)
			}
		}
	}
	if len(streams) == 0 {
		return "", fmt.Errorf("no seat queue (SEAT_ stream) to delete: register a module with a seat, or name a stream with DriftTargets")
	}
	slices.Sort(streams)
	name := streams[nm.rng.IntN(len(streams))]
	if err := js.DeleteStream(ctx, name); err != nil {
		return name, fmt.Errorf("delete stream %s: %w", name, err)
	}
	return name, nil
}

// healAll undoes whatever may be left: every member resumed or started, the network
// healed, every disk freed; then waits until the mesh is Settled.
func (nm *Nemesis) healAll(ctx context.Context) error {
	c := nm.c
	var errs []error
	errs = append(errs, c.Heal())
	for _, i := range c.Members() {
		n := c.Nodes[i]
		errs = append(errs, c.FreeDisk(i))
		switch {
		case n.Paused():
			errs = append(errs, n.Resume())
		case !n.Running():
			errs = append(errs, n.Start())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nemesis: heal everything: %w", err)
	}
	return nm.awaitReady(ctx)
}

// awaitReady waits until the mesh is Settled — every member ready, every stream's copies
// current — for nm.Recover at most: the next fault finds the mesh at full tolerance.
func (nm *Nemesis) awaitReady(ctx context.Context) error {
	start := time.Now()
	return poll(ctx, nm.Recover, func() error {
		if err := nm.c.Settled(); err != nil {
			return fmt.Errorf("the mesh is not settled %s after the last fault: %w", time.Since(start).Round(time.Millisecond), err)
		}
		return nil
	})
}

// poll calls f until it returns nil, timeout passes (f's last error) or ctx ends.
func poll(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
