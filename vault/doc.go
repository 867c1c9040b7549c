// Package vault mints and seals the mesh's credentials. Today it holds the two primitives
// every credential passes through — minting an nkey identity, and sealing a secret to the
// X25519 key (nkeys "xkey") of whoever asked — so that nothing else in meshnode makes a key
// or sends one in the clear. The sealed-record store and its bus tools build on these.
package vault
