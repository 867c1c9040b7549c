// Package throttle bounds how often one identity may ask the node for work — whoami, the
// vault, a node's seat tool — and turns a flood of refusals into one report per identity per
// interval, with a count, instead of one event (and an audit record on every node) each. A
// Gate also tells of an identity that keeps on past its refusals (OnFlood), and Bans is the
// back-off of the identities the node bars for it: longer each time they return flooding.
package throttle
