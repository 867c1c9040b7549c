package bench

import (
	"context"
	"time"
)

// Node is the node process of a Target, when the node runs in a process of its own: its
// memory is then the node's alone, and it can be restarted.
type Node interface {
	// RSS is the node process's resident memory, in bytes.
	RSS() (int64, error)
	// Restart stops the node and starts it again on the same data dir, and returns once it
	// is ready, with what its start took. The Target's URL stays valid.
	Restart(ctx context.Context) (Restarted, error)
}

// Restarted is what a node's restart took, from the new process's start. In nanoseconds in
// JSON.
type Restarted struct {
	// Stop is how long the old process took to exit once told to.
	Stop time.Duration `json:"stop_ns"`
	// Ready is the time until the node was ready (its readiness endpoint answered).
	Ready time.Duration `json:"ready_ns"`
	// Registry is when the registry's mirror held every record (its start step), counted
	// from the node's open; Reconcile is how long the controller's reconcile of every
	// module's topology took (ReconcileAll, the "topology" start step after "identity").
	Registry  time.Duration `json:"registry_ns"`
	Reconcile time.Duration `json:"reconcile_ns"`
	// Modules is how many modules whoami knew once the node was ready: every one the
	// registry holds, or the mirror had not caught up.
	Modules int `json:"modules"`
}
