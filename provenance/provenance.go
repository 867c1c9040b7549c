// Package provenance says who may speak for what in the mesh: which key signs an event
// under a source's name, and which sources own a subject — the audit log's Keys and Owners
// (package audit), from the registry and the seats' leases.
package provenance

import (
	"time"

	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/seats"
)

// Sources are the mesh's signers as one node knows them.
type Sources struct {
	// Node and NodeKey are this node's name and public key.
	Node, NodeKey string
	Registry      *registry.Registry
	// Leases is the seats' leases, once the node reads them (nil before, or on a site,
	// which holds no seat).
	Leases func() Leases
}

// Leases is what a node knows of the seats' leases (a seats.Store): a seat's lease now or
// the last a node held of it (a holder's late events stay its while the next one takes
// the seat), and the node-held lease of an epoch this node saw.
type Leases interface {
	LastHeld(key string) (seats.Lease, bool)
	HeldAt(key string, epoch uint64) (l seats.Lease, ended time.Time, ok bool)
}

// LateGrace is how long after the next lease of a node-held seat its previous holder's events
// may still be stored and judged by the lease they name: a holder learns it lost the seat
// only when a renewal fails (the lease's TTL), and what it published before is in flight.
// Later, an event naming an old lease is judged by the holder now — so a server that held
// the seat once cannot speak for it for ever by naming its old epoch.
const LateGrace = 10 * seats.DefaultTTL

// Key is the public key source signs subject's events with; epoch is the event's
// x-seat-epoch (0: none), at when the stream stored it.
func (s Sources) Key(subject, source string, epoch uint64, at time.Time) (string, bool) {
	if ns, owner, _, ok := manifest.SplitSubject(subject); ok && ns == "seat" && owner == source && source != manifest.VaultSeat {
		// The controller's and the cascade's seats, held by a node, sign with the key of the
		// node that held the lease the event names — or, for an epoch this node never saw
		// (it started after that lease) or none, with the holder's now or last.
		if nodeHeld(source) {
			l, ok := seats.Lease{}, false
			if book := s.leases(); book != nil {
				key := seats.Key(source, manifest.ScopeMesh, "")
				var ended time.Time
				if l, ended, ok = book.HeldAt(key, epoch); !ok || !ended.IsZero() && at.After(ended.Add(LateGrace)) {
					l, ok = book.LastHeld(key)
				}
			}
			if ok && l.Module == "" {
				if id, ok := s.Registry.Node(l.Node); ok {
					return id.PublicKey, true
				}
			}
		}
		// A seat's event is signed by its holder: an instance of the declaring module.
		if e, ok := s.Registry.Declarer(source); ok {
			return e.PublicKey, true
		}
		return "", false
	}
	switch source {
	case s.Node:
		return s.NodeKey, true
	case manifest.VaultSeat:
		pub := s.Registry.Vault()
		return pub, pub != ""
	}
	if e, ok := s.Registry.Get(source); ok {
		return e.PublicKey, true
	}
	if id, ok := s.Registry.Node(source); ok {
		return id.PublicKey, true // another server of the mesh
	}
	return "", false
}

// nodeHeld says whether seat is one a node holds: the controller's and the cascade's.
func nodeHeld(seat string) bool {
	return seat == manifest.ControllerSeat || seat == build.GitSeat || seat == build.BuilderSeat
}

// Unsettled says whether an event of a node-held seat (source) names a lease newer than any
// this node has seen (epoch, its x-seat-epoch): the new holder speaks as soon as it holds,
// and this node's copy of the leases may hear of it after the audit log reads the event. Its
// signer is not known yet (audit.Logger.Unsettled). An epoch the node will never see — a
// forger's — stays unsettled.
func (s Sources) Unsettled(subject, source string, epoch uint64) bool {
	ns, owner, _, ok := manifest.SplitSubject(subject)
	if !ok || ns != "seat" || owner != source || !nodeHeld(source) || epoch == 0 {
		return false
	}
	book := s.leases()
	if book == nil {
		return false
	}
	key := seats.Key(source, manifest.ScopeMesh, "")
	if _, _, seen := book.HeldAt(key, epoch); seen {
		return false
	}
	last, ok := book.LastHeld(key)
	return !ok || last.Epoch < epoch
}

// leases is the node's leases, nil when it reads none.
func (s Sources) leases() Leases {
	if s.Leases == nil {
		return nil
	}
	return s.Leases()
}

// Owns reports whether source may speak for the owner of subject's namespace: a module for
// its own events, a node for its own only (of another it saw fail or removed it reports
// under its own name), a seat's declarer — or the seat's name itself, signed by its holder
// (Key) — for the seat's.
func (s Sources) Owns(subject, source string) bool {
	kind, owner, _, ok := manifest.SplitSubject(subject)
	if !ok {
		return false
	}
	switch kind {
	case "mod", "node":
		return source == owner
	case "seat":
		if source == owner {
			return true
		}
		e, ok := s.Registry.Get(source)
		if !ok {
			return false
		}
		_, declares := e.Manifest.Seat(owner)
		return declares
	}
	return false
}
