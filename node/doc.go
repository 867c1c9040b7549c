// Package node is meshnode's composition root. A Node opens its parts in a fixed order —
// the data dir, the HTTP listener, the sandbox and the supervisor, the bus, the mesh's state,
// the controller, vault and seats, audit, the HTTP API — pushing how to close each on a
// lifecycle.Stack, so Close undoes exactly the steps Open took, the last first; it runs the
// parts' long-lived loops as the actors of one oklog/run group. Nothing here is global, so a
// test can run several nodes in one process. docs/architecture.md describes the whole.
package node
