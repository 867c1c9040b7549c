// Package ensure brings a JetStream stream, key-value bucket or object store to a
// configuration, creating it when absent. It asks to create first and updates only when the
// stream exists with another configuration: nats.go's CreateOrUpdate helpers ask to update
// first, and on a forming cluster an update that meets another server's create of the same
// stream still in flight is never answered (three servers opening a new mesh each waited
// out a request timeout for every bucket: 13 s of a 15 s formation), while a create with an
// equal configuration is idempotent and answered at once.
//
// A standalone server checks a create against the account's storage before it looks whether
// the stream exists, so a create of an existing stream that reserves much of the store is
// refused as "insufficient storage": that refusal, too, is followed by an update, and is
// returned only when the stream does not exist.
//
// The replicas asked for apply to a create only: an update keeps the copies the stream has.
// How many copies the mesh keeps is decided once, for every stream (package replication), and
// a node that opens a stream with an older count of the servers must not undo it.
package ensure

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream creates the stream cfg describes, or updates it to cfg.
func Stream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.CreateStream(ctx, cfg)
	if !mayExist(err) {
		return s, err
	}
	if rerr := keepReplicas(ctx, js, cfg.Name, &cfg.Replicas); rerr != nil {
		return nil, rerr
	}
	s, uerr := js.UpdateStream(ctx, cfg)
	if errors.Is(uerr, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	return s, uerr
}

// keepReplicas sets *replicas to the copies stream has; it leaves it as asked when the
// stream does not exist.
func keepReplicas(ctx context.Context, js jetstream.JetStream, stream string, replicas *int) error {
	s, err := js.Stream(ctx, stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return err
	}
	*replicas = s.CachedInfo().Config.Replicas
	return nil
}

// errStorageExceeded is nats-server's JSStorageResourcesExceededErr ("insufficient storage
// resources available"), a code nats.go does not name. It is spelled out rather than read
// from nats-server's package so that ensure, and the sdk above it, link no server; the
// package's tests check it against nats-server's constant.
const errStorageExceeded jetstream.ErrorCode = 10047

// mayExist reports whether a create's error may mean the stream exists.
func mayExist(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(err, jetstream.ErrBucketExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == errStorageExceeded)
}

// KeyValue creates the bucket cfg describes, or updates it to cfg.
func KeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if mayExist(err) {
		if err := keepReplicas(ctx, js, "KV_"+cfg.Bucket, &cfg.Replicas); err != nil {
			return nil, err
		}
		return js.CreateOrUpdateKeyValue(ctx, cfg) // absent after all: its create's error
	}
	return kv, err
}

// ObjectStore creates the object store cfg describes, or updates it to cfg.
func ObjectStore(ctx context.Context, js jetstream.JetStream, cfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	obs, err := js.CreateObjectStore(ctx, cfg)
	if mayExist(err) {
		if err := keepReplicas(ctx, js, "OBJ_"+cfg.Bucket, &cfg.Replicas); err != nil {
			return nil, err
		}
		return js.CreateOrUpdateObjectStore(ctx, cfg) // absent after all: its create's error
	}
	return obs, err
}
