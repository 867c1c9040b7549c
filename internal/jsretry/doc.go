// Package jsretry is the mesh's one policy for JetStream requests that meet a cluster while
// it settles: no leader yet for a stream or the meta group, no peers placed, a peer change in
// flight. Errors are told apart by type and by nats-server's error code, never by text.
//
// It has two forms, because a lost answer means two different things:
//
//   - Request runs an idempotent request (create a stream with a configuration, read a
//     bucket, look up a consumer) again after any settling error, a timeout included: asked
//     twice it does no harm. A clustered JetStream drops an API request sent while it has no
//     leader for the asset — the request is never answered — so a step asks again rather
//     than wait out its whole budget on one lost request.
//   - KV's writes (Put, Create, Update, Delete, Purge) are tried again only while the write
//     found no stream to store it (Leaderless): a timeout may mean it was stored, and a
//     Create or Update tried again after a stored attempt would fail or apply twice.
//
// When a clustered stream loses its leader (its server was killed, or restarts), a write to it
// finds no responder until the remaining peers elect another: nats.go tries twice, 250 ms
// apart, and returns jetstream.ErrNoStreamResponse. An election after a kill on a loaded
// machine takes longer than that (seconds), and an operator's `module register` then failed
// with "no response from stream" although the mesh had quorum.
package jsretry
