// Package snapshot writes and reads a meshnode backup: one file holding a snapshot of each of
// the mesh's streams (the registry, the vault's sealed records, provisions, STATE, the
// seats' leases and queues, the modules' KV buckets, DEAD, EVENTS and the artifacts), taken
// online through an operator's connection with JetStream's own snapshot API
// (streammove.SnapshotStream), so sequences, KV revisions and consumers' ack floors come back
// as they were.
//
// The file is a tar archive (format.go): MANIFEST.json first, one streams/<name>.snap per
// stream, SHA256SUMS last. Save writes it to FILE.tmp, syncs it and renames it, so a save
// killed midway leaves no file under the final name. Open checks the whole file — that it is
// a meshnode snapshot of a format this binary reads, complete, and every byte as written —
// before anything may use it.
//
// The vault's records are copied as they are: sealed under the barrier key, which the file
// does not hold. No seed is written: the operator's and the nodes' live in their data dirs.
package snapshot
