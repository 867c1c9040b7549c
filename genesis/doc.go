// Package genesis bootstraps a mesh. The vault mints every credential, the bus's included,
// but the vault needs a bus to run: nothing can go first. Genesis is the pivot (design 29
// §10): it mints exactly the foundation — the bus's own credentials (mesh id, the node's
// nkey and xkey, the route credential, the gossip key) and the vault's own (the barrier key,
// the vault's bus identity) — keeps it in the node's bbolt file, and, once store, bus and
// vault are up, is handed off: from then on the vault mints everything, and this package
// refuses to mint anything more on that data dir.
package genesis
