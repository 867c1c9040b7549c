// Package mirror keeps an in-memory copy of a JetStream KV bucket through a watch: the one
// loop behind the registry's, the seats' and the vault's mirrors. Load takes the bucket's
// current values; Follow applies changes until its context ends.
package mirror

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrClosed means the watch ended on its own: before the bucket's current values were all
// in (Load), or while following it (Follow).
var ErrClosed = errors.New("watch closed")

// Load applies every entry w delivers until the bucket's current values are all in (the
// watch's nil marker). If ctx ends first it stops w and returns ctx's error.
func Load(ctx context.Context, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry)) error {
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return ErrClosed
			}
			if e == nil {
				return nil
			}
			apply(e)
		case <-ctx.Done():
			w.Stop()
			return ctx.Err()
		}
	}
}

// Follow applies the changes w delivers until ctx ends (nil) or the watch closes on its own
// (ErrClosed: the mirror no longer follows the bucket, which its owner must not take for a
// stop). It does not stop w: the owner does, on close.
func Follow(ctx context.Context, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry)) error {
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return ErrClosed
			}
			if e != nil {
				apply(e)
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// Conflict reports whether a conditional KV write lost a race: the key already exists
// (Create), or its last revision is not the one the write expected (Update, or a publish or
// delete with an expected last sequence).
func Conflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// Stop stops a watch. A bucket deleted under it is no error of the watcher's: the node's
// drift check reports the loss (its stop would otherwise fail with "stream not found").
func Stop(w jetstream.KeyWatcher) error {
	err := w.Stop()
	// The watch's subscription reports the stream's absence with nats.go's own errors.
	if errors.Is(err, nats.ErrStreamNotFound) || errors.Is(err, nats.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	return err
}
