package audit

import (
	"bytes"
	"encoding/binary"
	"sync"
	"time"

	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
)

// The audit log sees every event EVENTS stores, so it is where the mesh learns how many
// bytes each namespace holds there: JetStream counts a stream's bytes and a subject's
// messages, never a subject's bytes. Usage is kept per namespace owner ("mod.<module>",
// "seat.<seat>", "node.<node>") and per slice of the events' stream time, in the same
// transaction as the records, so a restart neither loses nor double counts it. A slice's
// bytes count until its newest event has aged out of EVENTS: a little more than the stream
// holds (about two slices' worth: a slice, and the prune that comes once a slice), never
// less. A slice is a sixty-fourth of EVENTS' max age, between 100 ms and an hour, so the
// count follows a short max age closely too (an hour's slices overcounted a 3 s stream by a
// thousand times what it held, and slices of a second by two thirds).

// bucketUsage is owner \x00 slice start (unix milliseconds, u64) → bytes (u64), newest
// event's stream time (unix milliseconds, u64). A log written before holds owner \x00 hour (unix hours,
// u32) → bytes (u64): load rewrites it as a slice of an hour.
var bucketUsage = []byte("audit-usage")

// usageSlice is how finely usage ages out in a stream whose events live maxAge.
func usageSlice(maxAge time.Duration) time.Duration {
	if maxAge <= 0 {
		return time.Hour
	}
	return min(max(maxAge/64, 100*time.Millisecond), time.Hour)
}

// slice is one owner's bytes in one slice of stream time, and its newest event's time.
type slice struct {
	bytes  int64
	newest int64 // unix milliseconds
}

// usage is the in-memory copy of bucketUsage.
type usage struct {
	mu     sync.Mutex
	slices map[string]map[uint64]slice // owner → slice start → bytes
	total  map[string]int64            // owner → the sum of its slices, for Held
}

// Owner is the namespace owner of an event subject, as usage keys it: "mod.billing" for
// mesh.mod.billing.event.paid; "" for a subject outside the mesh's namespaces.
func Owner(subject string) string {
	ns, owner, _, ok := manifest.SplitSubject(subject)
	if !ok {
		return ""
	}
	return ns + "." + owner
}

// size is what one message costs EVENTS, counted as the admitter counted it.
func size(m jetstream.Msg) int64 { return envelope.StoredSize(m.Subject(), m.Headers(), m.Data()) }

func usageKey(owner string, start uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte(owner), 0), start)
}

// load reads bucketUsage into memory, rewriting a log's hours of before as slices.
func (u *usage) load(tx *bolt.Tx) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.slices, u.total = map[string]map[uint64]slice{}, map[string]int64{}
	b := tx.Bucket(bucketUsage)
	var legacy [][]byte
	b.ForEach(func(k, v []byte) error {
		owner, suffix, ok := bytes.Cut(k, []byte{0})
		var start uint64
		var sl slice
		switch {
		case ok && len(suffix) == 8 && len(v) == 16:
			start = binary.BigEndian.Uint64(suffix)
			sl = slice{bytes: int64(binary.BigEndian.Uint64(v[:8])), newest: int64(binary.BigEndian.Uint64(v[8:]))}
		case ok && len(suffix) == 4 && len(v) == 8:
			start = uint64(binary.BigEndian.Uint32(suffix)) * 3600_000
			sl = slice{bytes: int64(binary.BigEndian.Uint64(v)), newest: int64(start) + 3600_000 - 1}
			legacy = append(legacy, k)
		default:
			return nil // not a usage record: ignored, never trusted
		}
		u.add(string(owner), start, sl)
		return nil
	})
	for _, k := range legacy {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	if len(legacy) > 0 {
		return u.store(tx, u.slices)
	}
	return nil
}

// add counts sl in owner's slice start. u.mu is held.
func (u *usage) add(owner string, start uint64, sl slice) {
	if u.slices[owner] == nil {
		u.slices[owner] = map[uint64]slice{}
	}
	cur := u.slices[owner][start]
	u.slices[owner][start] = slice{bytes: cur.bytes + sl.bytes, newest: max(cur.newest, sl.newest)}
	u.total[owner] += sl.bytes
}

// store writes the slices of batch (owner → start → what was added) in tx, added to what
// the file holds; merge makes them visible once tx commits.
func (u *usage) store(tx *bolt.Tx, batch map[string]map[uint64]slice) error {
	b := tx.Bucket(bucketUsage)
	for owner, slices := range batch {
		for start, sl := range slices {
			k := usageKey(owner, start)
			if v := b.Get(k); len(v) == 16 {
				sl.bytes += int64(binary.BigEndian.Uint64(v[:8]))
				sl.newest = max(sl.newest, int64(binary.BigEndian.Uint64(v[8:])))
			}
			v := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(sl.bytes)), uint64(sl.newest))
			if err := b.Put(k, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// merge counts a committed batch in memory.
func (u *usage) merge(batch map[string]map[uint64]slice) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for owner, slices := range batch {
		for start, sl := range slices {
			u.add(owner, start, sl)
		}
	}
}

// Held is how many bytes of EVENTS owner holds (see Owner), as far as this node's audit log
// has read: a slice counts until the next prune after its newest event left the stream. The
// admitter asks it for every event it admits.
func (l *Logger) Held(owner string) int64 {
	l.usage.mu.Lock()
	defer l.usage.mu.Unlock()
	return l.usage.total[owner]
}

// pruneUsage drops the slices whose newest event has left a stream of maxAge.
func (l *Logger) pruneUsage(maxAge time.Duration) error {
	cutoff := time.Now().Add(-maxAge).UnixMilli()
	l.usage.mu.Lock()
	var old [][]byte
	for owner, slices := range l.usage.slices {
		for start, sl := range slices {
			if sl.newest < cutoff {
				old = append(old, usageKey(owner, start))
				l.usage.total[owner] -= sl.bytes
				delete(slices, start)
			}
		}
		if len(slices) == 0 {
			delete(l.usage.slices, owner)
			delete(l.usage.total, owner)
		}
	}
	l.usage.mu.Unlock()
	if len(old) == 0 {
		return nil
	}
	return l.db.Update(func(tx *bolt.Tx) error {
		for _, k := range old {
			if err := tx.Bucket(bucketUsage).Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}
