// Package recovery is the operator's custody of a mesh's keys for a restore: the recovery
// key (the vault's barrier key, printed as "MNRK1-…" with a checksum, so a typo is caught
// before anything is decrypted) and the sealed foundation a snapshot carries (the route
// secret, the gossip key and the vault's seed, sealed under a key derived from the barrier
// key). A snapshot file alone holds no key; with the recovery key it restores the mesh whole.
package recovery
