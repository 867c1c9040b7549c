package controller

import (
	"errors"
	"fmt"

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
	Seat      int64 // each SEAT_<S> work queue
	Registry  int64 // KV mesh-registry
	Leases    int64 // KV mesh-seats
	Vault     int64 // KV mesh-vault
	MaxEvent  int32 // the largest message EVENTS accepts; -1: the bus's maximum
}

// share is store/div, capped, and at least floor.
func share(store, div, floor, cap int64) int64 { return max(floor, min(store/div, cap)) }

// The default share of DEAD per consumer: a 1024th of DEAD, so a mesh takes about a thousand
// consumers before dead-max-bytes or dead-max-bytes-per-consumer must be set (a 20 GiB store
// keeps 2 MiB of letters per consumer), but at least 64 KiB, so a small store's consumers
// still keep a few letters of common sizes.
const (
	deadShares   = 1024
	minDeadShare = 64 << 10
)

// NewBudget sizes the mesh's streams within a store of the given size: the control
// plane's buckets first (a thirty-second each for registry, vault and STATE, less for leases),
// then EVENTS (half, or events-max-bytes), DEAD (a tenth, or dead-max-bytes) and each
// consumer's share of it (dead-max-bytes-per-consumer); each seat
// queue gets a sixty-fourth of what is left (at least 1 MiB, at most 1 GiB), so some
// sixty seats' queues fit.
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
	b.Seat = share(b.left(), 64, 1<<20, 1<<30)
	if cfg.SeatMaxBytes > 0 {
		b.Seat = int64(cfg.SeatMaxBytes)
	}
	return b
}

// left is what the control plane, EVENTS and DEAD leave of the store for seat queues.
func (b Budget) left() int64 {
	return max(0, b.Store-b.Registry-b.Leases-b.Vault-b.State-b.Events-b.Dead)
}

// apply sets the limits of one of the mesh's streams on its JetStream configuration. Every
// stream refuses new messages when full (DiscardNew): nothing already accepted is evicted to
// make room, and the writer hears why.
func (b Budget) apply(cfg *jetstream.StreamConfig) {
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
		cfg.MaxBytes = b.Seat
	}
}

// jsErrStorageExceeded is JetStream's error when a stream's reservation does not fit in the
// store.
const jsErrStorageExceeded = jetstream.ErrorCode(server.JSStorageResourcesExceededErr)

// storeFullError explains a refused reservation.
func storeFullError(stream string, b Budget, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStorageExceeded {
		return fmt.Errorf("the store has no room for %s (%s more; %s of the %s store is left for seat queues, about %d of them): raise store-max-bytes, lower events-max-bytes or dead-max-bytes, or lower seat-max-bytes for more, smaller seat queues: %w",
			stream, config.Bytes(b.Seat), config.Bytes(b.left()), config.Bytes(b.Store), b.left()/max(b.Seat, 1), err)
	}
	return err
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
