package audit

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	bolt "go.etcd.io/bbolt"
)

// Query returns the matching records in log order, using the index that narrows most, each
// with the verdict verify would give it (NotGenuine).
func (l *Logger) Query(f api.AuditFilter) ([]api.AuditRecord, error) {
	recs, err := l.query(f)
	for i := range recs {
		recs[i].NotGenuine, recs[i].NotGenuineWhy = l.genuine(recs[i])
	}
	return recs, err
}

func (l *Logger) query(f api.AuditFilter) ([]api.AuditRecord, error) {
	var pattern string
	if f.Event != "" {
		p, err := manifest.EventPattern(f.Event)
		if err != nil {
			return nil, fmt.Errorf("event pattern %q: %w", f.Event, err)
		}
		pattern = p
	}
	limit := f.Limit
	if limit <= 0 {
		limit = api.AuditDefaultLimit
	}
	var out []api.AuditRecord
	match := func(r api.AuditRecord) bool {
		return (f.ID == "" || r.EventID == f.ID) && (f.Source == "" || r.Source == f.Source) &&
			(pattern == "" || manifest.Matches(pattern, envelope.Unversioned(r.Subject))) &&
			(f.Since.IsZero() || !r.Received.Before(f.Since)) && (f.Until.IsZero() || r.Received.Before(f.Until)) &&
			r.N > f.After && (f.Before == 0 || r.N < f.Before)
	}
	err := l.db.View(func(tx *bolt.Tx) error {
		recs := tx.Bucket(bucketRecords)
		get := func(n []byte) (api.AuditRecord, bool) {
			r, _, err := decodeRecord(recs.Get(n))
			return r, err == nil
		}
		// Each visit returns false to stop. f.Last reads backwards and reverses.
		visit := func(n []byte) bool {
			if r, ok := get(n); ok && match(r) {
				out = append(out, r)
			}
			return f.Last > 0 && len(out) < f.Last || f.Last == 0 && len(out) < limit
		}
		switch {
		case f.ID != "":
			if n := tx.Bucket(bucketIDs).Get(keyPart(f.ID)); n != nil {
				visit(n)
			}
		case f.Source != "":
			scanPrefix(tx.Bucket(bucketBySource), sourcePrefix(f.Source), f.After, f.Before, f.Last > 0, visit)
		case pattern != "":
			// The index orders by subject, then number: gather the numbers, then visit in
			// log order, so paging and "last" mean the same as elsewhere.
			var ns [][]byte
			scanPrefix(tx.Bucket(bucketBySubject), literalPrefix(pattern), 0, 0, false, func(n []byte) bool {
				if at := binary.BigEndian.Uint64(n); at > f.After && (f.Before == 0 || at < f.Before) {
					ns = append(ns, n)
				}
				return true
			})
			slices.SortFunc(ns, bytes.Compare)
			if f.Last > 0 {
				slices.Reverse(ns)
			}
			for _, n := range ns {
				if !visit(n) {
					break
				}
			}
		default:
			c := recs.Cursor()
			if f.Last > 0 {
				k, _ := c.Last()
				if f.Before > 0 {
					if k, _ = c.Seek(u64(f.Before)); k == nil {
						k, _ = c.Last()
					} else {
						k, _ = c.Prev()
					}
				}
				for ; k != nil && visit(k); k, _ = c.Prev() {
				}
			} else {
				for k, _ := c.Seek(u64(f.After + 1)); k != nil && visit(k); k, _ = c.Next() {
				}
			}
		}
		return nil
	})
	sortByN(out)
	if f.Last > 0 && len(out) > f.Last {
		out = out[len(out)-f.Last:]
	}
	return out, err
}

// scanPrefix visits, in key order (or reverse), the record numbers of index keys that start
// with prefix — the last 8 bytes of each key — beginning after record number after (or, in
// reverse, before record number before, when the prefix is an exact key), until visit
// returns false.
func scanPrefix(b *bolt.Bucket, prefix []byte, after, before uint64, reverse bool, visit func(n []byte) bool) {
	c := b.Cursor()
	exact := bytes.IndexByte(prefix, 0) == len(prefix)-1 // source or subject, then \x00: the numbers that follow are in order
	if reverse {
		end := append(append([]byte(nil), prefix...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
		if before > 0 && exact {
			end = append(append([]byte(nil), prefix...), u64(before)...) // from it on, match leaves them out
		}
		k, _ := c.Seek(end)
		if k == nil {
			k, _ = c.Last()
		}
		for ; k != nil; k, _ = c.Prev() {
			if !bytes.HasPrefix(k, prefix) {
				if bytes.Compare(k, prefix) < 0 {
					return
				}
				continue
			}
			if !visit(k[len(k)-8:]) {
				return
			}
		}
		return
	}
	start := prefix
	if after > 0 && exact {
		start = append(append([]byte(nil), prefix...), u64(after+1)...)
	}
	for k, _ := c.Seek(start); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		if !visit(k[len(k)-8:]) {
			return
		}
	}
}

// literalPrefix is the part of a subject pattern before its first wildcard.
func literalPrefix(pattern string) []byte {
	for i := 0; i < len(pattern); i++ {
		if pattern[i] == '*' || pattern[i] == '>' {
			return []byte(pattern[:i])
		}
	}
	return []byte(pattern)
}

func sortByN(rs []api.AuditRecord) {
	slices.SortFunc(rs, func(a, b api.AuditRecord) int { return cmp.Compare(a.N, b.N) })
}

// MaxFlagged bounds the flagged records one verify lists, so its answer fits a message;
// so do maxFlagBytes, about what they may take, and flagKeep, what a flag keeps of each of
// its event's id, subject and source (twice that of its reason).
const (
	MaxFlagged   = 1000
	maxFlagBytes = 512 << 10
	flagKeep     = 200
)

// clip cuts s to at most n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if p := prefix(s, n); len(p) < len(s) {
		return p + "…"
	}
	return s
}

// prefix is s cut to at most n bytes on a rune boundary.
func prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Verify walks the whole log: every record's hash must be its content's, and link to the
// record before it.
func (l *Logger) Verify() (api.AuditVerification, error) { return l.VerifyProgress(nil) }

// VerifyProgress is Verify telling progress, when set, how far it has got about once a
// second: a log of millions of records takes a while.
func (l *Logger) VerifyProgress(progress func(api.AuditProgress)) (api.AuditVerification, error) {
	var v api.AuditVerification
	err := l.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRecords).Cursor()
		// The chain starts at record 1 with no previous hash, or, after pruning, right after
		// the anchor the prune left.
		var anchor head
		if b := tx.Bucket(bucketMeta).Get([]byte("anchor")); b != nil {
			json.Unmarshal(b, &anchor)
		}
		prev, wantN := anchor.Hash, anchor.N+1
		flagBytes := 0
		var lastN uint64
		var lastHash string
		total := readHead(tx).N - min(anchor.N, readHead(tx).N)
		told := time.Now()
		for k, raw := c.First(); k != nil; k, raw = c.Next() {
			n := binary.BigEndian.Uint64(k)
			v.Records++
			if progress != nil && v.Records%1024 == 0 && time.Since(told) >= l.progressEvery {
				progress(api.AuditProgress{Done: v.Records, Total: max(total, v.Records)})
				told = time.Now()
			}
			r, hashOK, err := decodeRecord(raw)
			if err != nil {
				v.Broken = &api.AuditProblem{N: n, Reason: "record is unreadable: " + err.Error()}
				return nil
			}
			switch {
			case r.N != n:
				v.Broken = &api.AuditProblem{N: n, Reason: fmt.Sprintf("record claims to be %d", r.N)}
			case n != wantN:
				v.Broken = &api.AuditProblem{N: n, Reason: fmt.Sprintf("record %d is missing: records were removed", wantN)}
			case !hashOK:
				v.Broken = &api.AuditProblem{N: n, Reason: "content does not match its hash: the record was altered"}
			case r.Prev != prev:
				v.Broken = &api.AuditProblem{N: n, Reason: "does not link to the record before it: a record was altered, removed or inserted"}
			}
			if v.Broken != nil {
				return nil
			}
			if kind, reason := l.genuine(r); kind != "" {
				v.FlaggedTotal++
				if len(v.Flagged) < MaxFlagged && flagBytes < maxFlagBytes {
					// Cut short: an emitter chooses these, and the answer must fit a message
					// whatever they hold, or one module would blind verify (Broken included).
					f := api.AuditFlag{N: n, EventID: clip(r.EventID, flagKeep), Subject: clip(r.Subject, flagKeep),
						Source: clip(r.Source, flagKeep), Kind: kind, Reason: clip(reason, 2*flagKeep)}
					flagBytes += len(f.EventID) + len(f.Subject) + len(f.Source) + len(f.Reason) + 64
					v.Flagged = append(v.Flagged, f)
				}
			}
			prev, wantN, lastN, lastHash = r.Hash, n+1, n, r.Hash
		}
		if r, ok := restoredFrom(tx); ok {
			v.Restored = &r
		}
		// The newest records must still be there: the head the writer kept names the last.
		if h := readHead(tx); v.Records > 0 && (h.N != lastN || h.Hash != lastHash) {
			v.Broken = &api.AuditProblem{N: h.N, Reason: fmt.Sprintf("the log ends at record %d but was written to %d: records were removed", lastN, h.N)}
		}
		return nil
	})
	return v, err
}

// genuine says why a record is not a genuine event (kind "" when it is): its signature, its
// source, its id. A signature whose key was unknown at ingest (a node or the vault recorded
// after its first event) is checked again with the keys known now, the remembered ones
// included: genuine if it verifies, a bad signature if a key is known now and it does not.
func (l *Logger) genuine(r api.AuditRecord) (kind, reason string) {
	if !r.Signed && strings.HasPrefix(r.SignatureError, noKeyPrefix) && l.keys != nil && !l.unsettled(r) {
		if pub, ok := l.key(r.Subject, r.Source, seatEpoch(nats.Header(r.Headers)), r.Received); ok {
			if err := envelope.Verify(nats.Header(r.Headers), r.Subject, r.Body, pub); err != nil {
				r.SignatureError = err.Error()
			} else {
				r.Signed = true
			}
		}
	}
	switch {
	case !r.Signed && strings.HasPrefix(r.SignatureError, unsignedPrefix):
		return api.AuditFlagUnsigned, r.SignatureError
	case !r.Signed && strings.HasPrefix(r.SignatureError, noKeyPrefix):
		return api.AuditFlagUnknownSource, r.SignatureError
	case !r.Signed:
		return api.AuditFlagBadSignature, r.SignatureError
	case !r.SourceMatches:
		return api.AuditFlagSourceMismatch, fmt.Sprintf("x-source %q does not own %s", r.Source, r.Subject)
	case r.ReusedID != 0:
		return api.AuditFlagReusedID, fmt.Sprintf("its x-event-id was first used by a different event, record %d", r.ReusedID)
	}
	if _, err := envelope.ParseID(r.EventID); err != nil {
		return api.AuditFlagBadID, err.Error()
	}
	return "", ""
}
