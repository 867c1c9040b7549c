package controller

import (
	"errors"
	"fmt"
	"strings"

	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// A node's JetStream store is shared by the data plane (EVENTS, DEAD, seat queues) and the
// control plane (leases, registry, vault, STATE). Once a module had filled the store with
// events, lease renewals failed and the controller and the vault lost their seats. So every
// stream and bucket has a byte limit, the limits are reserved with nats-server (which refuses
// a stream whose reservation does not fit), and the control plane's share is fixed before any
// data stream is sized: however full EVENTS gets, a lease can still be renewed.

// Budget is the byte limit of each of the mesh's streams and buckets on a node.
type Budget struct {
	Store  int64 // the node's JetStream store limit
	Events int64 // EVENTS; past it new emits are refused
	Module int64 // the most of EVENTS one module may hold (quota.go)
	Dead   int64 // DEAD
	// DeadShare is the most of DEAD one consumer's letters may hold (the dead-letter writer
	// removes the consumer's own oldest letters past it); DEAD holds a share for each
	// consumer, checked at registration (CheckDead).
	DeadShare int64
	State     int64 // STATE
	// Seat is a seat's work queue (SEAT_<S>) when its manifest declares no backlog.
	Seat int64
	// Seats is what the store leaves all seats' work queues together, each reserving its
	// backlog or Seat; a registration that would pass it is refused (CheckSeats).
	Seats int64
	// Provision is the provisions bucket and each bucket the mesh-kv provider makes.
	Provision int64
	Registry  int64 // KV mesh-registry
	Leases    int64 // KV mesh-seats
	Vault     int64 // KV mesh-vault
	MaxEvent  int32 // the largest message EVENTS accepts; -1: the bus's maximum
}

// share is store/div, capped, and at least floor.
func share(store, div, floor, cap int64) int64 { return max(floor, min(store/div, cap)) }

// The default share of DEAD per consumer: a 16384th of DEAD, so a mesh takes some sixteen
// thousand consumers before dead-max-bytes or dead-max-bytes-per-consumer must be set (a
// 57 GiB store keeps 356 KiB of letters per consumer; a 1024th stopped registration at 1,024
// consumers, short of issue 37's 10,000 modules with 1,000 seats), but at least 64 KiB, so a
// small store's consumers still keep a few letters of common sizes.
const (
	deadShares   = 16384
	minDeadShare = 64 << 10
)

// The default backlog of a seat, when its manifest declares none and seat-max-bytes is not
// set: a 1024th of the seats' room, at least 1 MiB (one job of the bus's largest) and at most
// 16 MiB (thousands of jobs of common sizes). A seat's queue was a sixty-fourth of the room,
// up to 1 GiB, reserved whether it held anything or not: a 57 GiB store took 64 seats. With
// the default a mesh takes about a thousand seats on the store it is given (57 GiB: some
// 1,400), and a seat that needs more says so with backlog:.
const (
	seatShares  = 1024
	maxSeatSize = 16 << 20
)

// NewBudget sizes the mesh's streams within a store of the given size: the control
// plane's buckets first (a thirty-second each for registry, vault and STATE, less for leases),
// then EVENTS (half, or events-max-bytes), DEAD (a tenth, or dead-max-bytes) and each
// consumer's share of it (dead-max-bytes-per-consumer); what is left is for the provisions'
// buckets (a sixty-fourth of it, at least 1 MiB, at most 1 GiB) and the seats' queues, each
// of which reserves its declared backlog or the default (seat-max-bytes, or a 1024th of the
// seats' room between 1 and 16 MiB).
func NewBudget(store int64, cfg config.Config) Budget {
	// A store sized from the disk's free space differs a little from node to node and from
	// start to start: coarse steps keep the mesh's stream limits from changing with it.
	switch {
	case store > 16<<30:
		store &^= 1<<30 - 1
	case store > 1<<30:
		store &^= 64<<20 - 1
	}
	b := Budget{
		Store:    store,
		Registry: share(store, 32, 1<<20, 256<<20),
		Leases:   share(store, 128, 256<<10, 64<<20),
		Vault:    share(store, 32, 1<<20, 256<<20),
		State:    share(store, 32, 1<<20, 256<<20),
		Events:   store / 2,
		Dead:     store / 10,
		MaxEvent: -1,
	}
	if cfg.EventsMaxBytes > 0 {
		b.Events = int64(cfg.EventsMaxBytes)
	}
	if b.Events > 0 { // zero: not sized, no quota unless one is set
		b.Module = max(b.Events/4, 1<<20)
	}
	if cfg.ModuleEventsMaxBytes > 0 {
		b.Module = int64(cfg.ModuleEventsMaxBytes)
	}
	if cfg.DeadMaxBytes > 0 {
		b.Dead = int64(cfg.DeadMaxBytes)
	}
	b.DeadShare = min(max(b.Dead/deadShares, minDeadShare), b.Dead)
	if cfg.DeadMaxBytesPerConsumer > 0 {
		b.DeadShare = int64(cfg.DeadMaxBytesPerConsumer)
	}
	if cfg.MaxEventBytes > 0 {
		b.MaxEvent = int32(min(int64(cfg.MaxEventBytes), 1<<30))
	}
	b.Provision = share(b.left(), 64, 1<<20, 1<<30)
	// In whole MiB, as a refusal prints them.
	b.Seats = max(0, b.left()-b.Provision) &^ (1<<20 - 1)
	b.Seat = share(b.Seats, seatShares, manifest.MinBacklog, maxSeatSize) &^ (1<<20 - 1)
	if cfg.SeatMaxBytes > 0 {
		b.Seat = int64(cfg.SeatMaxBytes)
	}
	return b
}

// left is what the control plane, EVENTS and DEAD leave of the store for provisions and
// seat queues.
func (b Budget) left() int64 {
	return max(0, b.Store-b.Registry-b.Leases-b.Vault-b.State-b.Events-b.Dead)
}

// apply sets the limits of one of the mesh's streams, derived as s, on its JetStream
// configuration. Every stream refuses new messages when full (DiscardNew): nothing already
// accepted is evicted to make room, and the writer hears why. So a seat's queue made with a
// larger limit (before seats were sized by their backlog) shrinks in place: JetStream keeps
// what it holds past the new limit (a DiscardNew stream's limit is never enforced on what is
// stored, nats-server's enforceBytesLimit) and refuses new jobs until the holder has taken
// enough.
func (b Budget) apply(cfg *jetstream.StreamConfig, s manifest.Stream) {
	if b.Store <= 0 {
		return // not sized (a test's topology)
	}
	cfg.Discard = jetstream.DiscardNew
	switch {
	case cfg.Name == manifest.EventsStreamName:
		cfg.MaxBytes, cfg.MaxMsgSize = b.Events, b.MaxEvent
	case cfg.Name == manifest.DeadStreamName:
		cfg.MaxBytes = b.Dead
	case cfg.Name == manifest.StateStreamName:
		cfg.MaxBytes = b.State
	default: // a seat's work queue
		cfg.MaxBytes = b.seatBytes(s)
	}
}

// seatBytes is what the work queue of a seat reserves: its declared backlog, or the default.
func (b Budget) seatBytes(s manifest.Stream) int64 {
	if s.MaxBytes > 0 {
		return s.MaxBytes
	}
	return b.Seat
}

// jsErrStorageExceeded is JetStream's error when a stream's reservation does not fit in the
// store.
const jsErrStorageExceeded = jetstream.ErrorCode(server.JSStorageResourcesExceededErr)

// storeFullError explains a refused reservation.
func storeFullError(stream string, b Budget, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStorageExceeded {
		return fmt.Errorf("the store has no room for %s (%s of the %s store is for seat queues; a seat without backlog: takes %s): raise store-max-bytes, lower events-max-bytes or dead-max-bytes, or declare smaller seat backlogs: %w",
			stream, config.Bytes(b.Seats), config.Bytes(b.Store), config.Bytes(b.Seat), err)
	}
	return err
}

// SeatsOf is what the work queues of d's seats reserve together.
func (b Budget) SeatsOf(d *manifest.Derivation) int64 {
	if d == nil {
		return 0
	}
	var n int64
	for _, s := range d.Seats {
		if s.Stream != nil {
			n += b.seatBytes(*s.Stream)
		}
	}
	return n
}

// CheckSeats refuses module's registration as d when the seats' queues would reserve more
// than the store leaves them (Seats): others is what every other seat's queue reserves (the
// mesh's own and every other module's), prev what module's seats reserved as it was
// registered before. A registration that reserves no more than before passes, so a module
// can always be registered again as it was.
func (b Budget) CheckSeats(module string, d *manifest.Derivation, others, prev int64) error {
	after := others + b.SeatsOf(d)
	if b.Store <= 0 || after <= b.Seats || after <= others+prev {
		return nil
	}
	var mine []string
	for _, s := range d.Seats {
		if s.Stream == nil {
			continue
		}
		size := config.Bytes(b.seatBytes(*s.Stream)).String()
		if s.Stream.MaxBytes == 0 {
			size += " (the default, seat-max-bytes)"
		}
		mine = append(mine, "seat "+s.Name+" "+size)
	}
	return fmt.Errorf("register: the store has no room for module %s's seat queues (%s): %s is left of the %s the %s store gives seat queues: declare a smaller backlog: for its seats, remove modules whose seats are no longer used, or raise store-max-bytes (or lower events-max-bytes, dead-max-bytes, or seat-max-bytes, the default backlog)",
		module, strings.Join(mine, ", "), config.Bytes(max(0, b.Seats-others)), config.Bytes(b.Seats), config.Bytes(b.Store))
}

// CheckDead refuses a registration that leaves DEAD without a share for each consumer: with
// consumers (every consumer whose letters DEAD keeps, the registration's included) DEAD would
// need more than it holds, and before (the count without it) it did not. A registration that
// adds no consumer passes, so a module can always be registered again as it was.
func (b Budget) CheckDead(module string, consumers, before int) error {
	if b.Store <= 0 || b.DeadShare <= 0 || consumers <= before || int64(consumers)*b.DeadShare <= b.Dead {
		return nil
	}
	return fmt.Errorf("register: DEAD has no room for module %s's dead letters: %d consumers × %s each (dead-max-bytes-per-consumer) is %s, over DEAD's %s (dead-max-bytes), which has shares for %d: raise dead-max-bytes (or store-max-bytes, a tenth of which it is by default), or lower dead-max-bytes-per-consumer (a letter larger than a share is not kept)",
		module, consumers, config.Bytes(b.DeadShare), config.Bytes(int64(consumers)*b.DeadShare), config.Bytes(b.Dead), b.Dead/b.DeadShare)
}

// deadConsumers adds to set the consumers of d whose letters DEAD keeps, as stream/consumer:
// its EVENTS consumer and each seat's, a node-scoped seat's once for each of nodes.
func deadConsumers(set map[string]struct{}, d *manifest.Derivation, nodes []string) {
	if d == nil {
		return
	}
	if c := d.EventsConsumer; c != nil && c.DeadSubject != "" {
		set[c.Stream+"/"+c.Name] = struct{}{}
	}
	for _, s := range d.Seats {
		if s.Stream == nil {
			continue
		}
		if s.Scope != manifest.ScopeNode {
			set[s.Stream.Name+"/"+manifest.SeatConsumerName(s.Name, s.Scope, "")] = struct{}{}
			continue
		}
		for _, node := range nodes {
			set[s.Stream.Name+"/"+manifest.SeatConsumerName(s.Name, s.Scope, node)] = struct{}{}
		}
	}
}
