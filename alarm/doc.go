// Package alarm is a node's standing reasons not to be ready: each part raises an alarm
// under its own key while something needs an operator (a lost bucket, a failed scheduled
// snapshot) and clears it when the cause is gone; /readyz answers 503 with every standing
// reason.
package alarm
