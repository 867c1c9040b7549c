package throttle

import "time"

// Window counts one identity's refusals in spans of time, to tell a client that keeps on
// past its refusals from one that backs off: the gate's flood report and the admitter's
// (package admit) both count with it. The zero value is an empty window.
type Window struct {
	start time.Time
	n     int
	told  bool
}

// Refused counts a refusal at now. flooded is true once per span — a span starts with the
// first refusal after the last one ended — when the span's refusals pass most; n is how many
// it holds.
func (w *Window) Refused(now time.Time, span time.Duration, most int) (flooded bool, n int) {
	if now.Sub(w.start) >= span {
		w.start, w.n, w.told = now, 0, false
	}
	w.n++
	if !w.told && w.n > most {
		w.told = true
		return true, w.n
	}
	return false, w.n
}
