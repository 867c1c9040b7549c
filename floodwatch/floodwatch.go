// Package floodwatch finds the client connection that floods: one whose inbound messages
// exceed a rate a second with bursts of a quarter second's worth (Rates, a token bucket per
// connection), read from the server's connection list every Sample and sooner when the
// modules' total count says one of them may be over (Schedule). The node bars what it finds
// (node/pacing.go); nothing here is read per message.
package floodwatch

import "time"

// Sample is how often the connections' message counts are read at least.
const Sample = 250 * time.Millisecond

// Peek is how often the watch reads the modules' total inbound count (one counter): a flood
// far over the rate is found within a peek or two.
const Peek = 25 * time.Millisecond

// Burst is how long a connection's bucket holds of its rate: it may send this long's worth
// at once. A quarter of a second, as the admitter's pace (node/admit.go): an unpaced flood —
// hundreds of thousands of messages a second from one client — empties it within the first
// peek that sees it (a second's worth took two or three, waiting twice as long after each
// early list that found nobody), while what a module does in earnest — the sdk's pipeline,
// at most 1,024 messages ahead of its acks; a consumer's acks, 32 at a time — is far within
// it. The flood benchmark's attacker saw itself cut off 83–147 ms into its flood with a
// second's worth (three runs), 30–98 ms with a quarter's (fourteen; its own notice of the
// close included).
const Burst = 250 * time.Millisecond

// ConnStat is one client connection's counts, as the server's connection list gives them.
type ConnStat struct {
	ID      uint64 // the server's connection id
	Key     string // the nkey it authenticated with
	InMsgs  int64  // messages it sent since it connected
	OutMsgs int64  // messages the server delivered to it since it connected
}

// Schedule (its zero value is ready) says when the watch lists the connections' counts (a Connz, whose cost grows
// with the connections): every Sample, and sooner when the modules together sent more
// since the last list than one connection may — which a flood does, and a busy mesh of
// many modules may do all the time, so an early list that finds nobody over the rate
// doubles the wait before the next early one, up to Sample, until a quiet spell.
type Schedule struct {
	every time.Duration // the least time between lists now
	at    time.Time     // the last list
	total int64         // the total inbound count at the last list
	next  int64         // the total Due last saw, for Walked
	early bool          // whether Due called the list early
	quiet bool          // whether the modules sent less than one connection may since the last list
}

// due reports whether to list the connections at now, the modules' total inbound count
// being total.
func (w *Schedule) Due(total int64, now time.Time, perSecond float64) bool {
	if w.every == 0 {
		w.every = Peek
	}
	since := now.Sub(w.at)
	over := float64(total-w.total) > perSecond*since.Seconds()
	w.next, w.quiet, w.early = total, !over, false
	if since >= Sample {
		return true
	}
	w.early = over && since >= w.every
	return w.early
}

// Walked records a list made at now; suspect says whether it found a connection over the
// rate or on its way there (Rates.Sample's draining), which the next peek lists again.
func (w *Schedule) Walked(now time.Time, suspect bool) {
	w.at, w.total = now, w.next
	switch {
	case suspect || w.quiet:
		w.every = Peek
	case w.early:
		w.every = min(2*w.every, Sample)
	}
}

// Rates follows each connection's inbound message count from sample to sample, as a
// token bucket per connection: perSecond tokens a second, at most Burst's worth, one spent
// per message. A connection that empties its bucket has kept up more than perSecond for
// long enough to have sent Burst's worth beyond it — at twice the rate in a quarter of a
// second, at eleven times in the first peek.
type Rates struct {
	last map[uint64]connSample // by connection id; nil until the first Sample
	// graced are the keys forgiven until a time: those sending over the rate when another
	// was barred (Grace).
	graced map[string]time.Time
}

// Grace is how long the keys sending over the rate, or sent to over it, when a flooder
// is barred are forgiven: a flood of requests makes their answerer send as fast (a seat's
// holder answering a flood of its tool), and after the flooder is cut off it still answers
// what it was sent, on a new connection if the server dropped it as a slow consumer. Found
// within a peek of the flood's start, the answerer may not have answered much yet; what was
// delivered to it says it will.
const Grace = 5 * time.Second

type connSample struct {
	key    string
	at     time.Time
	msgs   int64   // its count at the last sample
	tokens float64 // what is left of its bucket
	from   int64   // its count when its bucket was last full
	out    int64   // the messages delivered to it, at the last sample
	// sentTo says that more was delivered to it since the sample before than one connection
	// may send in that time: a seat's holder answering a flood of its tool, say.
	sentTo bool
}

// Over is a connection that emptied its bucket: its key and how many messages it sent
// since its bucket was last full.
type Over struct {
	Key  string
	Msgs int64
}

// Sample takes the counts read at now and returns the module connection that emptied its
// bucket and sent the most since it was full, and whether a module connection sent faster
// than perSecond since the sample before and has less than half its bucket left (draining:
// the schedule lists a peek apart while one does, and a busy mesh whose modules only brush
// the rate keeps its doubling waits); connections gone are forgotten. A connection
// that has been sent at least as many messages as it sent is answering, not flooding, and
// never returned (a module whose every request is answered at once is bounded by its
// answerer's pace). One at a time, and every other connection over the rate then is graced
// (Grace): what a flood made others send stops with it.
func (r *Rates) Sample(stats []ConnStat, now time.Time, perSecond float64, isModule func(key string) bool) (top Over, found, draining bool) {
	full := max(perSecond*Burst.Seconds(), 1)
	seen := make(map[uint64]connSample, len(stats))
	for _, st := range stats {
		s := connSample{key: st.Key, at: now, msgs: st.InMsgs, tokens: full, from: st.InMsgs, out: st.OutMsgs}
		prev, ok := r.last[st.ID]
		if ok {
			s.sentTo = float64(st.OutMsgs-prev.out) > perSecond*now.Sub(prev.at).Seconds()
		}
		if ok && !now.Before(r.graced[st.Key]) {
			// The refill is counted before the cap: what it sent between two lists may have
			// been sent after the bucket refilled, and a list a quarter second apart would
			// otherwise take a whole interval's refill from the burst.
			refill, spent := perSecond*now.Sub(prev.at).Seconds(), float64(st.InMsgs-prev.msgs)
			s.tokens = min(full, prev.tokens+refill-spent)
			if s.tokens < full {
				s.from = prev.from
			}
			if st.InMsgs > st.OutMsgs && isModule(st.Key) {
				if sent := st.InMsgs - s.from; s.tokens < 0 && sent > top.Msgs {
					top, found = Over{Key: st.Key, Msgs: sent}, true
				}
				draining = draining || (spent > refill && s.tokens < full/2)
			}
		}
		seen[st.ID] = s
	}
	for key, until := range r.graced {
		if !now.Before(until) {
			delete(r.graced, key)
		}
	}
	if found {
		if r.graced == nil {
			r.graced = map[string]time.Time{}
		}
		for id, s := range seen {
			if s.tokens < full || s.sentTo {
				r.graced[s.key] = now.Add(Grace)
			}
			s.tokens, s.from = full, s.msgs
			seen[id] = s
		}
		delete(r.graced, top.Key)
	}
	r.last = seen
	return top, found, draining
}
