package sdk

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
)

// KV returns the module's own key-value bucket, which the mesh provides when the module
// requires kv (`requires: [mesh-bus, kv]`): a JetStream key-value bucket that only this
// module's identity may read and write (DESIGN §12): get, put, create, update, delete and
// purge keys, not list or watch them. The mesh creates it when the module is deployed,
// before its host starts it (`meshnode provisions` says when it is ready).
func (c *Client) KV(ctx context.Context) (jetstream.KeyValue, error) {
	self := c.declared()
	if !slices.Contains(self.Requires, manifest.RequireKV) {
		return nil, fmt.Errorf("%w: module %s does not require kv (it requires %v); add it to requires: in its manifest and re-register",
			ErrNotDeclared, self.Module, self.Requires)
	}
	bucket := manifest.KVBucket(self.Module)
	kv, err := c.js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("bucket %s is not provisioned yet: the controller creates it once the module is deployed (`meshnode provisions`): %w", bucket, err)
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	return kv, nil
}
