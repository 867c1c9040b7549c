// Package seats holds the mesh's seats: per-scope leadership with one holder per scope, kept
// as leases in the JetStream KV bucket mesh-seats.
//
// A lease is a key with a per-key TTL: acquired with Create (only one creator wins), renewed
// by publishing the value again with the expected last subject sequence and a fresh message
// TTL (KV Update would drop the TTL), released by a delete at the lease's revision. A lease
// whose node dies expires after its TTL and the bucket's limit marker tells every watcher at
// once. The revision at which a lease was created is its epoch: the fencing token.
//
// Each node runs a Runner for the candidates connected to it: instances of modules that
// declare a seat and asked to hold it, and the node itself for the mesh's own seats. The
// Runner keeps the leases it holds, notices when a holder's connection is gone, and tells
// the node when a lease is gained, released or lost so that the bus's permissions follow.
package seats
