// Package envelope is the event envelope of DESIGN §4: the headers every event and job
// carries (the body is only the domain payload), and its Ed25519 signature by the emitter's
// nkey. The sdk and the CLI stamp envelopes; the audit logger verifies them. Nothing here
// refuses an unknown x- header: they are carried, never checked.
package envelope
