package audit

import (
	"slices"
	"sort"
	"time"

	"github.com/meshnode/meshnode/manifest"
)

// The log reads EVENTS whole, in order, so a stream sequence it never gets left the stream
// before it read it: evicted by EVENTS' per-subject cap or age limit while the log was
// behind, or deleted. But a sequence can also be late: delivered and not yet written (a
// failed write, a restart, a consumer that moved), it comes again after the ack wait, once
// newer ones are written. So a gap is only open at first; it counts as missed once it has
// stayed open for gapConfirm.

// gapConfirm is how long a gap stays open before it counts: a late event comes again after
// the audit consumer's ack wait.
const gapConfirm = 3 * manifest.AuditAckWait

// maxOpenGaps bounds the open gaps; past it the oldest count at once.
const maxOpenGaps = 4096

// gap is a range of stream sequences the log has not seen, open since a time.
type gap struct {
	lo, hi uint64
	since  time.Time
}

// gaps are the open gaps, in order.
type gaps []gap

// see takes a batch's stream sequences. seen is the highest the log had seen before it,
// floor the highest that never counts (the stream's last sequence when the log began
// counting; with both 0, nothing before the first sequence opens a gap). A sequence at or below seen fills
// an open gap; one above opens the gap behind it.
func (g gaps) see(seen, floor uint64, seqs []uint64, now time.Time) gaps {
	seqs = slices.Clone(seqs)
	slices.Sort(seqs)
	last := seen
	if last == 0 {
		last = floor // a new log: what came after it began counting does count
	}
	for _, s := range seqs {
		if s <= last {
			g = g.fill(s)
			continue
		}
		if lo := max(last+1, floor+1); last > 0 && lo < s {
			g = append(g, gap{lo: lo, hi: s - 1, since: now})
		}
		last = s
	}
	return g
}

// contains reports whether s is in an open gap: not seen yet, though newer ones were.
func (g gaps) contains(s uint64) bool {
	i := sort.Search(len(g), func(i int) bool { return g[i].hi >= s })
	return i < len(g) && g[i].lo <= s
}

// fill removes s from the open gap that holds it, if any.
func (g gaps) fill(s uint64) gaps {
	i := sort.Search(len(g), func(i int) bool { return g[i].hi >= s })
	if i == len(g) || g[i].lo > s {
		return g
	}
	x := g[i]
	switch {
	case x.lo == s && x.hi == s:
		return slices.Delete(g, i, i+1)
	case x.lo == s:
		g[i].lo++
	case x.hi == s:
		g[i].hi--
	default:
		g[i].hi = s - 1
		g = slices.Insert(g, i+1, gap{lo: s + 1, hi: x.hi, since: x.since})
	}
	return g
}

// settle removes the gaps open since before now-gapConfirm, and the oldest past
// maxOpenGaps, and returns how many sequences they held: events missed.
func (g gaps) settle(now time.Time) (gaps, uint64) {
	var missed uint64
	n := 0
	for n < len(g) && (now.Sub(g[n].since) >= gapConfirm || len(g)-n > maxOpenGaps) {
		missed += g[n].hi - g[n].lo + 1
		n++
	}
	return slices.Delete(g, 0, n), missed
}
