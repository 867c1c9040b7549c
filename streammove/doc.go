// Package streammove moves the streams of a JetStream account from one server to another
// (KV buckets and object stores are streams): SnapshotAll writes a snapshot of every stream
// into a directory, and Restore restores each into another JetStream — a cluster, at its
// replicas — checks its messages and sequences against the snapshot's and waits for it and
// its durable consumers to be caught up on every replica. A Restore interrupted anywhere can
// be called again: it keeps a stream restored whole, and restores again one that is not
// (RestoringMeta).
//
// SnapshotStream writes one stream's snapshot to any writer: package snapshot puts each into a
// backup file, whose restore unpacks them into a directory for Restore.
//
// node uses it to grow a single node into a mesh: a standalone server restarted clustered
// loses its streams (nats-server#5467), so its streams move through snapshots.
//
// It speaks the raw $JS.API (STREAM.SNAPSHOT, STREAM.RESTORE) rather than nats-io/jsm.go's
// SnapshotToDirectory and RestoreSnapshotFromDirectory. jsm.go (v0.5.1, in the module proxy)
// would replace only the chunk transfer, about 130 of these lines, and none of what the move
// needs beyond it: the durable consumers to check a restore against, the restoring mark, the
// check against the snapshot, the wait for replicas. It would add four modules (jsm.go, the
// expr-lang/expr expression language, go-humanize, gopkg.in/yaml.v3) and about 7.5 MB to a
// binary that links nats-server already, and drop two things a restore into a mesh just
// formed needs: a chunk sent again while the restoring server's interest has not crossed the
// route yet (sendChunk), and each request bounded on its own (apiWait) rather than by one
// client-wide timeout.
package streammove
