package jsretry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshnode/meshnode/internal/backoff"
)

// Patience is how long a write without a deadline of its own is tried: about the longest
// election a loaded three-node mesh was seen to take, with room.
const Patience = 15 * time.Second

// KV is a bucket whose writes (Put, PutString, Create, Update, Delete, Purge) are tried again
// while the stream has no leader, until the write's context ends or Patience passes. Reads
// and watches are the bucket's own: any replica answers a direct get.
type KV struct {
	jetstream.KeyValue
}

// Wrap returns kv with its writes riding through elections.
func Wrap(kv jetstream.KeyValue) *KV { return &KV{kv} }

// Leaderless reports whether err means the write found no stream to store it: stored nowhere,
// and worth trying again once a leader is elected.
func Leaderless(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// Patient is ctx, bounded by Patience when it has no deadline of its own.
func Patient(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, Patience)
}

// try runs write until it succeeds, fails otherwise than Leaderless, or time runs out; the
// last error is returned, wrapped with how long it was tried.
func try[T any](ctx context.Context, write func(context.Context) (T, error)) (T, error) {
	ctx, cancel := Patient(ctx)
	defer cancel()
	start := time.Now()
	b := backoff.Backoff{First: 50 * time.Millisecond, Max: time.Second}
	leaderless := false // an attempt found no leader
	for {
		v, err := write(ctx)
		switch {
		case err == nil:
			return v, nil
		case Leaderless(err):
			leaderless = true
		case !leaderless || ctx.Err() == nil:
			return v, err
		}
		// Time ran out (in nats.go's own wait, or in ours) after the stream had no leader: the
		// last error is returned as it is (the last attempt may have been stored, unless it
		// too found no leader), with the missing leader said.
		if ctx.Err() != nil || b.Wait(ctx) != nil {
			return v, fmt.Errorf("the bucket's stream had no leader for %s (is a majority of its servers up?): %w",
				time.Since(start).Round(time.Millisecond), err)
		}
	}
}

// Put is kv's Put, tried through an election.
func (kv *KV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return try(ctx, func(ctx context.Context) (uint64, error) { return kv.KeyValue.Put(ctx, key, value) })
}

// PutString is kv's PutString, tried through an election.
func (kv *KV) PutString(ctx context.Context, key string, value string) (uint64, error) {
	return kv.Put(ctx, key, []byte(value))
}

// Create is kv's Create, tried through an election.
func (kv *KV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	return try(ctx, func(ctx context.Context) (uint64, error) { return kv.KeyValue.Create(ctx, key, value, opts...) })
}

// Update is kv's Update, tried through an election.
func (kv *KV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	return try(ctx, func(ctx context.Context) (uint64, error) { return kv.KeyValue.Update(ctx, key, value, revision) })
}

// Delete is kv's Delete, tried through an election.
func (kv *KV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	_, err := try(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, kv.KeyValue.Delete(ctx, key, opts...) })
	return err
}

// Purge is kv's Purge, tried through an election.
func (kv *KV) Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	_, err := try(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, kv.KeyValue.Purge(ctx, key, opts...) })
	return err
}
