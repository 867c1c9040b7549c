// Package registry keeps the mesh's registered modules in the JetStream KV bucket
// mesh-registry and mirrors it in memory through a watch. The bus's authentication reads only
// the mirror (it runs under nats-server's locks and must never make a NATS call); writes go
// to the bucket with optimistic concurrency and return once the mirror has seen them.
package registry
