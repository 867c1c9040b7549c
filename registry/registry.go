package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/internal/jsretry"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/mirror"
	"github.com/meshnode/meshnode/outbox"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// Bucket is the KV bucket of registered modules.
const Bucket = "mesh-registry"

// historyDepth is how many revisions of each record the bucket keeps (DESIGN §3: ≥ 5).
const historyDepth = 5

const modulePrefix = "module."

// Identity keys: the operator's public key (every node admits the operator), the vault's
// (every node verifies its events), and each server's nkey and xkey (every node verifies
// their events; the vault hands its credentials only to a server's own xkey).
const (
	operatorKey   = "identity.operator"
	vaultKey      = "identity.vault"
	nodeKeyPrefix = "identity.node."
)

// NodeIdentity is a server's public keys.
type NodeIdentity struct {
	PublicKey string `json:"public_key"`
	XKey      string `json:"xkey"`
}

// Errors of writing the registry.
var (
	// ErrNotFound means no module of that name is registered.
	ErrNotFound = errors.New("module not registered")
	// ErrConflict means the record changed since it was read; read again and retry.
	ErrConflict = errors.New("registration changed concurrently")
)

// Record is one registered module as stored in the bucket.
type Record struct {
	// Module is the module's name; the key is "module.<name>".
	Module string `json:"module"`
	// Manifest is the manifest's YAML as registered.
	Manifest string `json:"manifest"`
	// PublicKey is the module's nkey public key: its identity on the bus.
	PublicKey string `json:"public_key"`
	// Fingerprints are the protocol fingerprints of the module's seats, by seat.
	Fingerprints map[string]string `json:"fingerprints,omitempty"`
	// Registered is when the module was first registered; Updated when last changed.
	Registered time.Time `json:"registered"`
	Updated    time.Time `json:"updated"`
	// Outbox holds the events of changes stored with the record and not yet published.
	Outbox []outbox.Event `json:"outbox,omitempty"`
	// Removed marks a removed module's record kept only until its event is published: to the
	// mirror the module is gone.
	Removed bool `json:"removed,omitempty"`
	// Bound is, for each seat the module uses that was declared when it registered (by a
	// module or built in), the protocol it registered against: no later declaration of the
	// seat may break it.
	Bound map[string]manifest.Protocol `json:"bound,omitempty"`
	// Pins are the later protocol versions the module speaks, by seat (`meshnode seat pin`);
	// a seat not listed is spoken at v1. Bound holds the pinned version's protocol.
	Pins map[string]string `json:"pins,omitempty"`
	// Providers are the seats chosen to provide the interfaces the module requires, by
	// interface (`meshnode provisions pin`): needed when several seats provide one.
	Providers map[string]string `json:"providers,omitempty"`
	// Deployment is where and what the module runs (`meshnode deploy`); nil: it is not
	// deployed (its instances are started by hand, if at all).
	Deployment *api.Deployment `json:"deployment,omitempty"`
}

// Entry is a registered module as the mirror holds it: the record, its bucket revision, and
// the manifest parsed and derived once.
type Entry struct {
	Record
	Revision   uint64
	Manifest   *manifest.Manifest
	Derivation *manifest.Derivation
}

// ChangeFunc is told about each change the watch sees: old is nil for a new module, new is
// nil for a removed one. It runs on the watch goroutine and must not block for long.
type ChangeFunc func(old, new *Entry)

// Registry is the mirror of mesh-registry and the way to write it.
type Registry struct {
	log      *slog.Logger
	onChange ChangeFunc

	kv    jetstream.KeyValue
	watch *mirror.Watch

	mu       sync.RWMutex
	cond     *sync.Cond // broadcast when rev advances
	byModule map[string]*Entry
	listed   []*Entry             // byModule sorted by name (List); nil after a change
	changes  uint64               // changes to what the registry holds (changed), for the caches to know theirs is the newest
	signers  map[string]signersAt // Signers' answers, by module
	emitted  *emitIndex           // who emits what (Signers); nil after a change
	// leaving holds removed modules' records that wait for their event (Record.Removed).
	leaving  map[string]*Entry
	byKey    map[string]*Entry
	bySeat   map[string]*Entry // the module that declares each seat
	rev      uint64            // the highest bucket revision the mirror has applied
	operator string            // the operator's public key: every node admits it
	vault    string            // the vault's public key
	nodes    map[string]NodeIdentity
	sites    map[string]SiteIdentity // the mesh's sites (issue 42), by name
	// nodesChanged receives (without blocking: one pending is enough) when a server's
	// identity comes or goes: the controller declares a node that joins.
	nodesChanged chan struct{}
	// bad holds, by key, the revision of a module record that was refused: the next write of
	// that module replaces it.
	bad map[string]uint64
}

// New returns an empty registry; Open connects it to the bucket.
func New(log *slog.Logger, onChange ChangeFunc) *Registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if onChange == nil {
		onChange = func(_, _ *Entry) {}
	}
	r := &Registry{log: log, onChange: onChange, byModule: map[string]*Entry{}, byKey: map[string]*Entry{}, bySeat: map[string]*Entry{}, bad: map[string]uint64{},
		leaving: map[string]*Entry{}, nodesChanged: make(chan struct{}, 1)}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// Open creates or updates the bucket, starts watching it and returns once the mirror holds
// every record the bucket had. Run must then be running for the mirror to follow changes.
// maxBytes bounds the bucket (reserved with JetStream); zero: no bound.
func (r *Registry) Open(ctx context.Context, js jetstream.JetStream, replicas int, maxBytes int64) error {
	kv, err := ensure.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "meshnode: registered modules, their manifests and identities",
		History:     historyDepth,
		Replicas:    replicas,
		Storage:     jetstream.FileStorage,
		MaxBytes:    maxBytes, // 0: no bound
	})
	if err != nil {
		return fmt.Errorf("open %s: %w", Bucket, err)
	}
	return r.load(ctx, kv)
}

// OpenMirror opens a site's registry (issue 42): a mirror of the hub's bucket in the site's
// own JetStream domain, which JetStream keeps current while the site's link is up and which
// the site reads while it is down. The site writes nothing through it; a write goes to the
// hub, over the link. It returns once this Registry holds what the mirror held.
func (r *Registry) OpenMirror(ctx context.Context, js jetstream.JetStream, maxBytes int64) error {
	kv, err := ensure.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "meshnode: this site's mirror of the mesh's registry",
		History:     historyDepth,
		Storage:     jetstream.FileStorage,
		MaxBytes:    maxBytes,
		Mirror:      &jetstream.StreamSource{Name: Bucket, Domain: manifest.HubDomain},
	})
	if err != nil {
		return fmt.Errorf("open the mirror of %s: %w", Bucket, err)
	}
	return r.load(ctx, kv)
}

// load starts watching kv and returns once this Registry holds every record it had.
func (r *Registry) load(ctx context.Context, kv jetstream.KeyValue) (err error) {
	// The watch outlives ctx, which only bounds the start: Close stops it.
	r.kv = jsretry.Wrap(kv)
	if r.watch, err = mirror.Open(ctx, kv, r.apply); err != nil {
		return fmt.Errorf("load %s: %w", Bucket, err)
	}
	return nil
}

// Run follows the bucket until ctx ends.
func (r *Registry) Run(ctx context.Context) error { return r.watch.Run(ctx) }

// Close stops the watch. The mirror keeps its last state.
func (r *Registry) Close() error {
	if r.watch == nil {
		return nil
	}
	return r.watch.Close()
}

// apply folds one bucket entry into the mirror. Every value is untrusted input (anything may
// have been written to the bucket): a value that does not decode and validate is logged with
// its key and skipped, and the mirror holds the newest earlier good revision of that key
// from the bucket's history (the same on every node, and after a restart), or nothing.
func (r *Registry) apply(kve jetstream.KeyValueEntry) {
	if strings.HasPrefix(kve.Key(), "identity.") {
		r.applyIdentity(kve)
		r.advance(kve.Revision())
		return
	}
	name, ok := strings.CutPrefix(kve.Key(), modulePrefix)
	if !ok {
		r.advance(kve.Revision())
		return
	}
	var next, leaving *Entry
	if kve.Operation() == jetstream.KeyValuePut {
		next = r.decodeModule(kve)
	}
	if next != nil && next.Removed {
		leaving, next = next, nil
	}
	r.mu.Lock()
	if leaving != nil {
		r.leaving[name] = leaving
	} else {
		delete(r.leaving, name)
	}
	r.changed()
	prev := r.byModule[name]
	if prev != nil {
		delete(r.byKey, prev.PublicKey)
		delete(r.byModule, name)
		for _, s := range prev.Manifest.Seats {
			if r.bySeat[s.Name] == prev {
				delete(r.bySeat, s.Name)
			}
		}
	}
	if next != nil {
		if other, taken := r.byKey[next.PublicKey]; taken {
			r.log.Error("registry record refused: skipped; its key is another module's",
				"key", kve.Key(), "revision", kve.Revision(), "module", other.Module)
			next = nil
		}
	}
	delete(r.bad, kve.Key())
	if kve.Operation() == jetstream.KeyValuePut && (next == nil || next.Revision != kve.Revision()) && (leaving == nil || leaving.Revision != kve.Revision()) {
		// The record at the key is a bad one: the next write of this module replaces it.
		r.bad[kve.Key()] = kve.Revision()
	}
	if next != nil {
		next.Revision = kve.Revision() // a write replaces the record at the key, good or bad
		r.byModule[name] = next
		r.byKey[next.PublicKey] = next
		for _, s := range next.Manifest.Seats {
			r.bySeat[s.Name] = next
		}
	}
	r.mu.Unlock()
	// The change hook (which kicks connections whose authority changed) runs before the
	// revision counts as applied: a write that waits for its revision (Put) returns only
	// once this node has acted on it.
	if prev != nil || next != nil {
		r.onChange(prev, next)
	}
	r.advance(kve.Revision())
}

// decodeModule returns the module record kve holds, or, when that is bad, the newest
// earlier good one from the key's history; nil when there is none.
func (r *Registry) decodeModule(kve jetstream.KeyValueEntry) *Entry {
	e, err := decode(kve)
	if err == nil {
		return e
	}
	r.log.Error("registry record refused: skipped; re-register the module to replace it",
		"key", kve.Key(), "revision", kve.Revision(), "err", err)
	var found *Entry
	r.history(kve, func(old jetstream.KeyValueEntry) bool {
		found, err = decode(old)
		return err == nil
	})
	if found != nil {
		r.log.Warn("registry record: the previous good revision stays in force",
			"key", kve.Key(), "revision", found.Revision)
	}
	return found
}

// applyIdentity folds an identity.* entry into the mirror.
func (r *Registry) applyIdentity(kve jetstream.KeyValueEntry) {
	key := kve.Key()
	var check func([]byte) error
	switch {
	case key == operatorKey || key == vaultKey:
		check = checkUserKey
	case strings.HasPrefix(key, nodeKeyPrefix):
		check = checkNodeIdentity
	case strings.HasPrefix(key, siteKeyPrefix):
		check = checkSiteIdentity
	default:
		return
	}
	value, put := kve.Value(), kve.Operation() == jetstream.KeyValuePut
	if put {
		if err := check(value); err != nil {
			r.log.Error("registry identity refused: skipped", "key", key, "revision", kve.Revision(), "err", err)
			put = false
			r.history(kve, func(old jetstream.KeyValueEntry) bool {
				if check(old.Value()) != nil {
					return false
				}
				value, put = old.Value(), true
				return true
			})
			if put {
				r.log.Warn("registry identity: the previous good revision stays in force", "key", key)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changed()
	switch {
	case key == operatorKey:
		r.operator = ""
		if put {
			r.operator = string(value)
		}
	case key == vaultKey:
		r.vault = ""
		if put {
			r.vault = string(value)
		}
	case strings.HasPrefix(key, siteKeyPrefix):
		r.applySite(strings.TrimPrefix(key, siteKeyPrefix), value, put)
	default:
		name := strings.TrimPrefix(key, nodeKeyPrefix)
		var id NodeIdentity
		if put && json.Unmarshal(value, &id) == nil {
			if r.nodes == nil {
				r.nodes = map[string]NodeIdentity{}
			}
			r.nodes[name] = id
		} else {
			delete(r.nodes, name)
		}
		r.nodeChanged()
	}
}

// NodesChanged receives when a server's identity is added to the mirror or removed from it
// (a node joined, or was removed): one receive may stand for several changes.
func (r *Registry) NodesChanged() <-chan struct{} { return r.nodesChanged }

// nodeChanged signals NodesChanged without blocking.
func (r *Registry) nodeChanged() {
	select {
	case r.nodesChanged <- struct{}{}:
	default:
	}
}

// historyTimeout bounds the look into a key's history for its last good revision.
const historyTimeout = 5 * time.Second

// history offers good, newest first, the revisions of kve's key older than kve, until good
// returns true or a delete is met (before it, the key held nothing).
func (r *Registry) history(kve jetstream.KeyValueEntry, good func(jetstream.KeyValueEntry) bool) {
	if r.kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), historyTimeout)
	defer cancel()
	entries, err := r.kv.History(ctx, kve.Key())
	if err != nil {
		r.log.Warn("registry history unreadable", "key", kve.Key(), "err", err)
		return
	}
	for i := len(entries) - 1; i >= 0; i-- {
		old := entries[i]
		if old.Revision() >= kve.Revision() {
			continue
		}
		if old.Operation() != jetstream.KeyValuePut || good(old) {
			return
		}
	}
}

func checkUserKey(value []byte) error {
	if !nkeys.IsValidPublicUserKey(string(value)) {
		return fmt.Errorf("%.40q is not an nkey user public key", value)
	}
	return nil
}

func checkNodeIdentity(value []byte) error {
	var id NodeIdentity
	if err := json.Unmarshal(value, &id); err != nil {
		return fmt.Errorf("not a node identity: %w", err)
	}
	if !nkeys.IsValidPublicServerKey(id.PublicKey) {
		return fmt.Errorf("%.40q is not an nkey server public key", id.PublicKey)
	}
	if !nkeys.IsValidPublicCurveKey(id.XKey) {
		return fmt.Errorf("%.40q is not an xkey public key", id.XKey)
	}
	return nil
}

func (r *Registry) advance(rev uint64) {
	r.mu.Lock()
	if rev > r.rev {
		r.rev = rev
	}
	r.cond.Broadcast()
	r.mu.Unlock()
}

// decode reads a module record: untrusted input, checked against its key.
func decode(kve jetstream.KeyValueEntry) (*Entry, error) {
	var rec Record
	if err := json.Unmarshal(kve.Value(), &rec); err != nil {
		return nil, fmt.Errorf("not a module record: %w", err)
	}
	if want := modulePrefix + rec.Module; kve.Key() != want {
		return nil, fmt.Errorf("the record names module %.40q, whose key is not %s", rec.Module, kve.Key())
	}
	if !nkeys.IsValidPublicUserKey(rec.PublicKey) {
		return nil, fmt.Errorf("%.40q is not an nkey user public key", rec.PublicKey)
	}
	m, err := manifest.Parse([]byte(rec.Manifest))
	if err != nil {
		return nil, err
	}
	if m.Module != rec.Module {
		return nil, fmt.Errorf("the record of module %s holds the manifest of %.40q", rec.Module, m.Module)
	}
	d, err := m.DeriveWith(rec.Pins)
	if err != nil {
		return nil, err
	}
	if err := outbox.Check(rec.Outbox, isAction); err != nil {
		return nil, err
	}
	return &Entry{Record: rec, Revision: kve.Revision(), Manifest: m, Derivation: d}, nil
}

// Operator returns the operator's public key, "" before genesis has handed off.
func (r *Registry) Operator() string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.operator
}

// Revision is the highest bucket revision the mirror has applied: it changes with every
// change of the registry.
func (r *Registry) Revision() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.rev
}

// SetOperator records the operator's public key for every node. This node's mirror holds it
// at once (genesis sets it before the watch runs); the others' when their watch sees it.
func (r *Registry) SetOperator(ctx context.Context, publicKey string) error {
	if _, err := r.kv.Put(ctx, operatorKey, []byte(publicKey)); err != nil {
		return fmt.Errorf("record the operator's key: %w", err)
	}
	r.mu.Lock()
	r.operator = publicKey
	r.changed()
	r.mu.Unlock()
	return nil
}

// Vault returns the vault's public key, "" before it is recorded.
func (r *Registry) Vault() string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.vault
}

// SetVault records the vault's public key.
func (r *Registry) SetVault(ctx context.Context, publicKey string) error {
	if _, err := r.kv.Put(ctx, vaultKey, []byte(publicKey)); err != nil {
		return fmt.Errorf("record the vault's key: %w", err)
	}
	r.mu.Lock()
	r.vault = publicKey
	r.changed()
	r.mu.Unlock()
	return nil
}

// Node returns a server's public keys.
func (r *Registry) Node(name string) (NodeIdentity, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	id, ok := r.nodes[name]
	return id, ok
}

// SetNode records a server's public keys.
func (r *Registry) SetNode(ctx context.Context, name string, id NodeIdentity) error {
	b, _ := json.Marshal(id)
	if _, err := r.kv.Put(ctx, nodeKeyPrefix+name, b); err != nil {
		return fmt.Errorf("record node %s's keys: %w", name, err)
	}
	r.mu.Lock()
	if r.nodes == nil {
		r.nodes = map[string]NodeIdentity{}
	}
	r.nodes[name] = id
	r.changed()
	r.nodeChanged()
	r.mu.Unlock()
	return nil
}

// RemoveNode forgets a server's public keys: a removed server is no longer one of the mesh's
// (the vault hands it nothing, the audit no longer knows its key).
func (r *Registry) RemoveNode(ctx context.Context, name string) error {
	if err := r.kv.Delete(ctx, nodeKeyPrefix+name); err != nil {
		return fmt.Errorf("forget node %s's keys: %w", name, err)
	}
	r.mu.Lock()
	delete(r.nodes, name)
	r.changed()
	r.nodeChanged()
	r.mu.Unlock()
	return nil
}

// Nodes returns the names of the mesh's servers, sorted (empty, not nil, when none).
func (r *Registry) Nodes() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]string{}, slices.Sorted(maps.Keys(r.nodes))...)
}

// ByKey returns the module whose identity is publicKey. It reads memory only.
func (r *Registry) ByKey(publicKey string) (*Entry, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.byKey[publicKey]
	return e, ok
}

// Get returns the registered module name.
func (r *Registry) Get(name string) (*Entry, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.byModule[name]
	return e, ok
}

// Names returns every registered module's name, in order.
func (r *Registry) Names() []string {
	entries := r.List()
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Module
	}
	return names
}

// List returns every registered module, by name.
func (r *Registry) List() []*Entry {
	r.mu.RLock()
	if listed := r.listed; listed != nil {
		r.mu.RUnlock()
		return slices.Clone(listed)
	}
	out := make([]*Entry, 0, len(r.byModule))
	for _, e := range r.byModule {
		out = append(out, e)
	}
	at := r.changes
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b *Entry) int { return strings.Compare(a.Module, b.Module) })
	r.mu.Lock()
	if r.changes == at {
		r.listed = out // asked every second by the dashboard and the quotas: sorted once per change
	}
	r.mu.Unlock()
	return slices.Clone(out)
}

// Declarer returns the registered module that declares seat.
func (r *Registry) Declarer(seat string) (*Entry, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e := r.bySeat[seat]
	return e, e != nil
}

// DeclaredSeat returns seat as the registered module that declares it declares it, or, for
// the mesh's own seats no module replaces, as the built-in manifest does.
func (r *Registry) DeclaredSeat(seat string) (manifest.Seat, bool) {
	if e, ok := r.Declarer(seat); ok {
		if s, ok := e.Manifest.Seat(seat); ok {
			return s, true
		}
	}
	return manifest.BuiltinSeat(seat)
}

// Seat describes seat as DeclaredSeat has it, every version; only the name when nobody
// declares it (yet).
func (r *Registry) Seat(seat string) api.SeatInfo {
	s, ok := r.DeclaredSeat(seat)
	if !ok {
		return api.SeatInfo{Seat: seat}
	}
	info := api.SeatInfoOf(s, manifest.V1)
	for _, v := range s.Versions {
		info.Versions = append(info.Versions, api.SeatInfoOf(s, v.Name))
	}
	return info
}

// SeatAt describes seat at the version e's module is pinned to: what it speaks to the seat.
func (r *Registry) SeatAt(e *Entry, seat string) api.SeatInfo {
	version := manifest.NormalVersion(e.Pins[seat])
	s, ok := r.DeclaredSeat(seat)
	if !ok {
		return api.SeatInfo{Seat: seat}
	}
	return api.SeatInfoOf(s, version)
}

// Signers returns the keys of every source whose events or jobs m's module can be handed:
// each module that emits an event its consumes patterns match, each seat with a matching
// event (its declaring module's key, under both names, since either may be the x-source),
// when a pattern reaches the servers' events (only "**" does) every server's key and the
// vault's, and every module that may submit jobs to a seat m declares (its users, and m).
func (r *Registry) Signers(m *manifest.Manifest) api.Signers {
	r.mu.RLock()
	at := r.changes
	if c, ok := r.signers[m.Module]; ok && c.at == at && c.manifest == m {
		r.mu.RUnlock()
		return maps.Clone(c.out)
	}
	r.mu.RUnlock()
	out := r.signersOf(m)
	r.mu.Lock()
	if r.changes == at { // nothing changed while it was worked out
		if r.signers == nil || len(r.signers) > 1<<16 {
			r.signers = map[string]signersAt{}
		}
		r.signers[m.Module] = signersAt{at: at, manifest: m, out: out}
	}
	r.mu.Unlock()
	return maps.Clone(out)
}

// signersAt is Signers' answer for a manifest as the registry stood at change at: every
// connect asks it (whoami), and working it out walks every module.
type signersAt struct {
	at       uint64
	manifest *manifest.Manifest
	out      api.Signers
}

// changed marks a change to what the registry holds, under r.mu: the caches start again.
func (r *Registry) changed() {
	r.changes++
	r.listed = nil
	r.emitted = nil
}

// emitIndex is every event the registered modules and their seats emit, by emitter, as the
// registry stood at change at: Signers looks a module's sources up in it. Walking every
// module for each whoami made connecting n modules cost n² (issue 37: 10,000 modules).
type emitIndex struct {
	at       uint64
	all      []emitted            // every event subject of every module
	byOwner  map[string][]emitted // by the subject's owner token: a module's name, a seat's
	users    map[string][]*Entry  // seat → the modules using it
	byModule map[string]*Entry
}

// emitted is one event subject and who emits it: a module, or the module declaring seat.
type emitted struct {
	subject string
	entry   *Entry
	seat    string
}

// emitters returns the index of the registry as it stands, built once per change.
func (r *Registry) emitters() *emitIndex {
	r.mu.RLock()
	if idx := r.emitted; idx != nil && idx.at == r.changes {
		r.mu.RUnlock()
		return idx
	}
	at := r.changes
	r.mu.RUnlock()
	idx := &emitIndex{at: at, byOwner: map[string][]emitted{}, users: map[string][]*Entry{}, byModule: map[string]*Entry{}}
	add := func(owner string, em emitted) {
		idx.all = append(idx.all, em)
		idx.byOwner[owner] = append(idx.byOwner[owner], em)
	}
	for _, e := range r.List() {
		idx.byModule[e.Module] = e
		for _, ev := range e.Manifest.Emits {
			add(e.Module, emitted{subject: manifest.EventSubject(e.Module, ev), entry: e})
		}
		for _, s := range e.Manifest.Uses {
			idx.users[s] = append(idx.users[s], e)
		}
		for _, s := range e.Manifest.Seats {
			for _, version := range s.VersionNames() {
				v, _ := s.At(version)
				// As v1's subject: a consumes pattern names no version (the consumer's
				// filter holds the pinned one).
				for _, ev := range v.Emits {
					add(s.Name, emitted{subject: manifest.SeatEventSubject(s.Name, ev), entry: e, seat: s.Name})
				}
			}
		}
	}
	r.mu.Lock()
	if r.changes == at { // nothing changed while it was built
		r.emitted = idx
	}
	r.mu.Unlock()
	return idx
}

func (r *Registry) signersOf(m *manifest.Manifest) api.Signers {
	var patterns []string
	for _, c := range m.Consumes {
		if s, err := manifest.ConsumeSubject(c); err == nil {
			patterns = append(patterns, s)
		}
	}
	// reaches reports whether a pattern can match some event of kind: the servers' and the
	// vault's events are not declared anywhere, so only the kind token can tell.
	reaches := func(kind string) bool {
		return slices.ContainsFunc(patterns, func(p string) bool {
			toks := strings.SplitN(p, ".", 3)
			return len(toks) > 1 && (toks[1] == "*" || toks[1] == kind)
		})
	}
	out := api.Signers{}
	idx := r.emitters()
	for _, p := range patterns {
		// A pattern naming its emitter is matched against that emitter's events alone.
		candidates := idx.all
		if _, owner, _, ok := manifest.SplitSubject(p); ok && owner != "*" && owner != ">" {
			candidates = idx.byOwner[owner]
		}
		for _, em := range candidates {
			if !manifest.Matches(p, em.subject) {
				continue
			}
			out[api.SignerKey(api.SignerModule, em.entry.Module)] = em.entry.PublicKey
			if em.seat != "" {
				out[api.SignerKey(api.SignerSeat, em.seat)] = em.entry.PublicKey
			}
		}
	}
	if len(m.Seats) > 0 {
		if e, ok := idx.byModule[m.Module]; ok {
			out[api.SignerKey(api.SignerJob, e.Module)] = e.PublicKey // it submits jobs to its own seats
		}
	}
	for _, s := range m.Seats {
		for _, e := range idx.users[s.Name] {
			out[api.SignerKey(api.SignerJob, e.Module)] = e.PublicKey // it submits jobs to m's seats
		}
	}
	if reaches(api.SignerNode) {
		for _, name := range r.Nodes() {
			if id, ok := r.Node(name); ok {
				out[api.SignerKey(api.SignerNode, name)] = id.PublicKey
			}
		}
	}
	if pub := r.Vault(); pub != "" && reaches(api.SignerSeat) {
		out[api.SignerKey(api.SignerSeat, manifest.VaultSeat)] = pub
	}
	return out
}

// Bindings returns every module's binding to seat, except skip's: the version it is pinned
// to; for a user, the protocol it registered (or was pinned) against, or — registered before
// the seat was declared, or before bindings were recorded — that version as the seat is
// declared now; for a consumer of the seat's events by name, those events.
func (r *Registry) Bindings(seat, skip string) []manifest.Binding {
	current, declared := r.DeclaredSeat(seat)
	var out []manifest.Binding
	for _, e := range r.List() {
		if e.Module == skip {
			continue
		}
		b := manifest.Binding{Module: e.Module, Seat: seat, Version: manifest.NormalVersion(e.Pins[seat]),
			Events: consumedEvents(e.Manifest, seat)}
		if slices.Contains(e.Manifest.Uses, seat) {
			if p, ok := e.Bound[seat]; ok {
				b.Uses, b.Protocol = true, p
			} else if at, ok := current.At(b.Version); ok && declared {
				b.Uses, b.Protocol = true, at.Protocol()
			}
		}
		if b.Uses || len(b.Events) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// consumedEvents are the events of seat m consumes by the seat's name, as subject patterns
// after mesh.seat.<seat>.event. (billing.> for seat.<seat>.billing.**).
func consumedEvents(m *manifest.Manifest, seat string) []string {
	var out []string
	prefix := manifest.SeatEventSubject(seat, "")
	for _, c := range m.Consumes {
		if s, ok := manifest.ConsumedSeat(c); ok && s == seat {
			if subject, err := manifest.ConsumeSubject(c); err == nil {
				out = append(out, strings.TrimPrefix(subject, prefix))
			}
		}
	}
	return out
}

// Catalogue returns the manifests of every registered module except skip.
func (r *Registry) Catalogue(skip string) []*manifest.Manifest {
	var out []*manifest.Manifest
	for _, e := range r.List() {
		if e.Module != skip {
			out = append(out, e.Manifest)
		}
	}
	return out
}

// Put writes rec. revision is the revision it replaces, 0 for a new module; if the record
// changed meanwhile Put returns ErrConflict. It returns once the mirror holds the write.
func (r *Registry) Put(ctx context.Context, rec Record, revision uint64) (*Entry, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	key := modulePrefix + rec.Module
	if revision == 0 {
		// A refused record at the key is no module: the write replaces it.
		r.mu.RLock()
		revision = r.bad[key]
		r.mu.RUnlock()
	}
	var rev uint64
	if revision == 0 {
		rev, err = r.kv.Create(ctx, key, b)
	} else {
		rev, err = r.kv.Update(ctx, key, b, revision)
	}
	if err != nil {
		if mirror.Conflict(err) {
			return nil, fmt.Errorf("%w: module %s; retry", ErrConflict, rec.Module)
		}
		return nil, fmt.Errorf("write %s: %w", key, err)
	}
	if err := r.waitRevision(ctx, rev); err != nil {
		return nil, err
	}
	e, _ := r.Get(rec.Module)
	return e, nil
}

// Delete removes module name at revision (0: whatever it is) and returns once the mirror
// has seen it.
func (r *Registry) Delete(ctx context.Context, name string, revision uint64) error {
	var opts []jetstream.KVDeleteOpt
	if revision != 0 {
		opts = append(opts, jetstream.LastRevision(revision))
	}
	if err := r.kv.Delete(ctx, modulePrefix+name, opts...); err != nil {
		return fmt.Errorf("delete module %s: %w", name, err)
	}
	// A delete's revision is not returned; the module's absence from the mirror is the signal.
	return r.waitFor(ctx, func() bool {
		_, live := r.byModule[name]
		_, leaving := r.leaving[name]
		return !live && !leaving
	})
}

// waitRevision blocks until the mirror has applied revision rev.
func (r *Registry) waitRevision(ctx context.Context, rev uint64) error {
	defer r.watch.Awaiting(ctx, r.resumed(rev))()
	return r.waitFor(ctx, func() bool { return r.rev >= rev })
}

// resumed logs a resumption of the watch while a write at rev waited for it.
func (r *Registry) resumed(rev uint64) func(error) {
	return func(err error) {
		if err != nil {
			r.log.Warn("the registry's watch has not delivered a write; it cannot be resumed yet", "revision", rev, "err", err)
			return
		}
		r.log.Warn("the registry's watch had not delivered a write; resumed", "revision", rev)
	}
}

// waitFor blocks until cond (called with r.mu held) is true or ctx ends.
func (r *Registry) waitFor(ctx context.Context, cond func() bool) error {
	stop := context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for !cond() {
		if ctx.Err() != nil {
			return fmt.Errorf("wait for the registry mirror: %w", ctx.Err())
		}
		r.cond.Wait()
	}
	return nil
}

// Bad lists the keys whose latest record was refused (it does not decode, validate, or it
// claims another module's key): skipped until a write replaces it.
func (r *Registry) Bad() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Sorted(maps.Keys(r.bad))
}

// maxWhoamiRequest bounds a whoami request's body: it names one key.
const maxWhoamiRequest = 1 << 10

// Whoami answers a connection that asks which module its key is (manifest.WhoamiSubject),
// as node: key is the asker's (the last token of the subject, which only that key may publish
// on), replyTo where the answer goes, data the request. answer is false when nothing is to be
// answered: a request that is not about the asker's own key, or (why says so) a reply subject
// outside the inbox of the key asked about (_INBOX.<key>.…) or of its module
// (_INBOX.<module>.…), which only that key's connections may subscribe to — a connection
// learns about its own key, never another module's declarations or secrets.
func (r *Registry) Whoami(key, replyTo string, data []byte, node string) (reply api.WhoamiReply, answer bool, why string) {
	var req api.WhoamiRequest
	if len(data) > maxWhoamiRequest || json.Unmarshal(data, &req) != nil || req.PublicKey != key {
		return reply, false, ""
	}
	e, ok := r.ByKey(req.PublicKey)
	if !manifest.InInbox(replyTo, api.BootstrapInbox(req.PublicKey)) && !(ok && manifest.InInbox(replyTo, manifest.InboxPrefix(e.Module))) {
		return reply, false, "reply subject outside the key's inbox"
	}
	if !ok {
		return api.WhoamiReply{Error: "no module is registered with key " + req.PublicKey}, true, ""
	}
	reply = api.WhoamiReply{
		Module: e.Module, Node: node,
		Emits: e.Manifest.Emits, Consumes: e.Manifest.Consumes, Tools: e.Manifest.Tools, Secrets: e.Manifest.Secrets,
		Requires: e.Manifest.Requires, Signers: r.Signers(e.Manifest),
	}
	for _, s := range e.Manifest.Uses {
		reply.Uses = append(reply.Uses, r.SeatAt(e, s)) // the version it is pinned to
	}
	for _, s := range e.Manifest.Seats {
		reply.Seats = append(reply.Seats, r.Seat(s.Name))
	}
	return reply, true, ""
}
