// Package node is meshnode's composition root. A Node opens its parts in a fixed order —
// store, bus, HTTP — closes them in reverse, and runs its long-lived parts as the actors of
// one oklog/run group. Nothing here is global, so a test can run several nodes in one
// process.
package node
