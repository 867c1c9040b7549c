package bench

import (
	"context"
	"time"
)

// NodeFloodRate is the flood-rate of the node the bench measures: its flood watch runs,
// listing the connections as every node's does, at a rate no bench connection reaches (the
// default, 20,000 messages a second in bursts of a quarter second's worth, would bar its
// pipelined emitter, which the node's pace, off in the bench, no longer holds back).
const NodeFloodRate = 1_000_000

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
