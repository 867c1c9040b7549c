package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/ensure"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// KVStore keeps the records in the Bucket, and a copy of them in memory: the controller's
// holder is their only writer, so it reads them once (Load, when it takes the seat) and then
// from memory — a listing of keys is an ephemeral consumer, whose deletion every node's drift
// watch hears.
type KVStore struct {
	KV jetstream.KeyValue

	mu      sync.Mutex
	records map[string]api.Provision // nil until loaded
}

// OpenStore creates or opens the Bucket with the mesh's replicas;
// maxBytes bounds it (reserved with JetStream, like every bucket of the mesh).
func OpenStore(ctx context.Context, js jetstream.JetStream, replicas int, maxBytes int64) (*KVStore, error) {
	kv, err := ensure.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: Bucket, Description: "meshnode: provisions (consumer, interface, provider, state; never a credential)",
		Replicas: replicas, Storage: jetstream.FileStorage, History: 1, MaxBytes: maxBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", Bucket, err)
	}
	return &KVStore{KV: kv}, nil
}

// Load reads every record from the bucket (a record that does not decode is skipped: the
// next pass writes it again).
func (s *KVStore) Load(ctx context.Context) error {
	out := map[string]api.Provision{}
	lister, err := s.KV.ListKeys(ctx)
	if err != nil {
		return err
	}
	defer lister.Stop()
	for key := range lister.Keys() {
		e, err := s.KV.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		var r api.Provision
		if json.Unmarshal(e.Value(), &r) != nil || Key(r.Consumer, r.Interface) != key {
			continue
		}
		out[key] = r
	}
	s.mu.Lock()
	s.records = out
	s.mu.Unlock()
	return nil
}

// Forget drops the copy in memory: the next All reads the bucket again.
func (s *KVStore) Forget() {
	s.mu.Lock()
	s.records = nil
	s.mu.Unlock()
}

// All returns every record by key, loading them first if need be.
func (s *KVStore) All(ctx context.Context) (map[string]api.Provision, error) {
	s.mu.Lock()
	loaded := s.records != nil
	s.mu.Unlock()
	if !loaded {
		if err := s.Load(ctx); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.records), nil
}

// Put stores r.
func (s *KVStore) Put(ctx context.Context, r api.Provision) error {
	b, _ := json.Marshal(r)
	if _, err := s.KV.Put(ctx, Key(r.Consumer, r.Interface), b); err != nil {
		return err
	}
	s.mu.Lock()
	if s.records != nil {
		s.records[Key(r.Consumer, r.Interface)] = r
	}
	s.mu.Unlock()
	return nil
}

// Delete forgets a record.
func (s *KVStore) Delete(ctx context.Context, key string) error {
	if err := s.KV.Purge(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	s.mu.Lock()
	delete(s.records, key)
	s.mu.Unlock()
	return nil
}

// MeshKV is the mesh's own provider of kv: a JetStream key-value bucket per consumer
// (manifest.KVBucket), which the consumer's derived permissions reach and no one else's do.
// It needs no credential: the consumer uses its bus identity.
type MeshKV struct {
	JS       jetstream.JetStream
	Replicas int
	// MaxBytes bounds each bucket (reserved with JetStream): one module cannot fill the
	// store the mesh's own buckets need.
	MaxBytes int64
}

// MaxKVValue bounds one value of a module's bucket.
const MaxKVValue = 1 << 20

// Create makes the consumer's bucket when it is missing; an existing one is kept as it is.
func (p MeshKV) Create(ctx context.Context, req api.ProvisionCreateRequest) (api.ProvisionCreateReply, error) {
	bucket := manifest.KVBucket(req.Consumer)
	if _, err := p.JS.KeyValue(ctx, bucket); err == nil {
		return api.ProvisionCreateReply{}, nil
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return api.ProvisionCreateReply{}, err
	}
	_, err := p.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: bucket, Description: "meshnode: module " + req.Consumer + "'s own (requires: [kv])",
		Replicas: p.Replicas, Storage: jetstream.FileStorage, History: 1, MaxBytes: p.MaxBytes, MaxValueSize: MaxKVValue,
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		return api.ProvisionCreateReply{}, nil
	}
	return api.ProvisionCreateReply{}, err
}

// Remove deletes the consumer's bucket and its keys.
func (p MeshKV) Remove(ctx context.Context, req api.ProvisionRemoveRequest) error {
	err := p.JS.DeleteKeyValue(ctx, manifest.KVBucket(req.Consumer))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	return err
}

// Holds lists the consumers whose bucket exists.
func (p MeshKV) Holds(ctx context.Context, _ string) ([]string, error) {
	names := p.JS.KeyValueStoreNames(ctx)
	prefix := manifest.KVBucket("")
	var out []string
	for name := range names.Name() {
		if consumer, ok := strings.CutPrefix(name, prefix); ok && manifest.ValidName(consumer) {
			out = append(out, consumer)
		}
	}
	if err := names.Error(); err != nil {
		return nil, err
	}
	return out, nil
}

// Seat is a provider reached over the bus: the create, remove and holds tools of a seat
// whose protocol provides the interface, answered by its holder (request/reply to the role).
type Seat struct {
	NC   *nats.Conn
	Name string
	// Node is the calling node: answers come to manifest.ProvisionInbox.<node>.…, where
	// the provisioner's grant lets it answer.
	Node string
}

// Header names of a tool's error reply (the NATS micro framework's, which the sdk writes).
const serviceError = "Nats-Service-Error"

func (p Seat) call(ctx context.Context, tool string, req, out any) error {
	body, _ := json.Marshal(req)
	subject := manifest.SeatToolSubject(p.Name, tool)
	inbox := manifest.ProvisionInbox + "." + p.Node + "." + nuid.Next()
	sub, err := p.NC.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := p.NC.PublishMsg(&nats.Msg{Subject: subject, Reply: inbox, Data: body}); err != nil {
		return fmt.Errorf("seat %s %s: %w", p.Name, tool, err)
	}
	msg, err := sub.NextMsgWithContext(ctx)
	if err == nil && len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
		err = nats.ErrNoResponders
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%w: no holder of seat %s answers %s (is its module running?)", ErrUnavailable, p.Name, tool)
	}
	if err != nil {
		return fmt.Errorf("seat %s %s: %w", p.Name, tool, err)
	}
	if e := msg.Header.Get(serviceError); e != "" {
		return fmt.Errorf("seat %s refused %s: %s", p.Name, tool, e)
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		return fmt.Errorf("seat %s answered %s with something that is not its reply: %w", p.Name, tool, err)
	}
	return nil
}

// Create calls the seat's create.
func (p Seat) Create(ctx context.Context, req api.ProvisionCreateRequest) (api.ProvisionCreateReply, error) {
	var out api.ProvisionCreateReply
	if err := p.call(ctx, api.ProvisionToolCreate, req, &out); err != nil {
		return api.ProvisionCreateReply{}, err
	}
	if len(out.Sealed) == 0 {
		return api.ProvisionCreateReply{}, fmt.Errorf("seat %s answered create with no sealed credential", p.Name)
	}
	return out, nil
}

// Remove calls the seat's remove.
func (p Seat) Remove(ctx context.Context, req api.ProvisionRemoveRequest) error {
	var out struct{}
	return p.call(ctx, api.ProvisionToolRemove, req, &out)
}

// Holds calls the seat's holds.
func (p Seat) Holds(ctx context.Context, iface string) ([]string, error) {
	var out api.ProvisionHoldsReply
	if err := p.call(ctx, api.ProvisionToolHolds, api.ProvisionHoldsRequest{Interface: iface}, &out); err != nil {
		return nil, err
	}
	return out.Consumers, nil
}
