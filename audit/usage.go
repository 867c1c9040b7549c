package audit

import (
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
// "seat.<seat>", "node.<node>") and per hour of the events' stream time, in the same
// transaction as the records, so a restart neither loses nor double counts it. An hour's
// bytes count until the whole hour has aged out of EVENTS: a little more than the stream
// holds, never less.

// bucketUsage is owner \x00 hour (unix hours, u32) → bytes (u64).
var bucketUsage = []byte("audit-usage")

// usageHour is how finely usage ages out.
const usageHour = time.Hour

// usage is the in-memory copy of bucketUsage.
type usage struct {
	mu    sync.Mutex
	bytes map[string]map[uint32]int64 // owner → hour → bytes
	total map[string]int64            // owner → the sum of its hours, for Held
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

func hourOf(t time.Time) uint32 { return uint32(t.Unix() / int64(usageHour/time.Second)) }

func usageKey(owner string, hour uint32) []byte {
	return binary.BigEndian.AppendUint32(append([]byte(owner), 0), hour)
}

// load reads bucketUsage into memory.
func (u *usage) load(tx *bolt.Tx) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.bytes, u.total = map[string]map[uint32]int64{}, map[string]int64{}
	tx.Bucket(bucketUsage).ForEach(func(k, v []byte) error {
		if len(k) < 5 || len(v) != 8 {
			return nil // not a usage record: ignored, never trusted
		}
		owner, hour := string(k[:len(k)-5]), binary.BigEndian.Uint32(k[len(k)-4:])
		if u.bytes[owner] == nil {
			u.bytes[owner] = map[uint32]int64{}
		}
		u.bytes[owner][hour] = int64(binary.BigEndian.Uint64(v))
		u.total[owner] += int64(binary.BigEndian.Uint64(v))
		return nil
	})
}

// add writes a batch's new bytes (owner → hour → bytes) in tx; merge makes them visible
// once tx commits.
func (u *usage) add(tx *bolt.Tx, batch map[string]map[uint32]int64) error {
	b := tx.Bucket(bucketUsage)
	for owner, hours := range batch {
		for hour, n := range hours {
			k := usageKey(owner, hour)
			if v := b.Get(k); len(v) == 8 {
				n += int64(binary.BigEndian.Uint64(v))
			}
			if err := b.Put(k, binary.BigEndian.AppendUint64(nil, uint64(n))); err != nil {
				return err
			}
		}
	}
	return nil
}

func (u *usage) merge(batch map[string]map[uint32]int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for owner, hours := range batch {
		if u.bytes[owner] == nil {
			u.bytes[owner] = map[uint32]int64{}
		}
		for hour, n := range hours {
			u.bytes[owner][hour] += n
			u.total[owner] += n
		}
	}
}

// firstLive is the oldest hour of which EVENTS may still hold an event, given its max age.
func firstLive(now time.Time, maxAge time.Duration) uint32 { return hourOf(now.Add(-maxAge)) }

// Usage is how many bytes of EVENTS each namespace owner holds (see Owner), for a stream
// whose events live maxAge: counted by this node's audit log, so as current as its ingest.
func (l *Logger) Usage(maxAge time.Duration) map[string]int64 {
	first := firstLive(time.Now(), maxAge)
	l.usage.mu.Lock()
	defer l.usage.mu.Unlock()
	out := map[string]int64{}
	for owner, hours := range l.usage.bytes {
		for hour, n := range hours {
			if hour >= first {
				out[owner] += n
			}
		}
	}
	return out
}

// Held is how many bytes of EVENTS owner holds (see Owner), as far as this node's audit log
// has read: Usage's figure for one owner, without its scan — it counts an hour until the
// next prune drops it (a little more than the stream holds, never less). The admitter asks
// it for every event it admits.
func (l *Logger) Held(owner string) int64 {
	l.usage.mu.Lock()
	defer l.usage.mu.Unlock()
	return l.usage.total[owner]
}

// pruneUsage drops the hours every event of which has left a stream of maxAge.
func (l *Logger) pruneUsage(maxAge time.Duration) error {
	first := firstLive(time.Now(), maxAge)
	l.usage.mu.Lock()
	var old [][]byte
	for owner, hours := range l.usage.bytes {
		for hour := range hours {
			if hour < first {
				old = append(old, usageKey(owner, hour))
				l.usage.total[owner] -= hours[hour]
				delete(hours, hour)
			}
		}
		if len(hours) == 0 {
			delete(l.usage.bytes, owner)
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
