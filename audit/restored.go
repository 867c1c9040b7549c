package audit

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	bolt "go.etcd.io/bbolt"
)

// RestoredEvent is the node event a restored node's log begins with (api.AuditRestored).
const RestoredEvent = "restored"

// BeginRestored makes r, signed by the node with key, the first record of node's log in db:
// the log of a node restored from a snapshot begins by naming it, and the events that
// follow (EVENTS as restored) chain from it. Called again with the same snapshot (a restore
// resumed after a crash) it does nothing; a log that begins otherwise is refused.
func BeginRestored(db *bolt.DB, key envelope.Signer, r api.AuditRestored) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	subject := manifest.NodeEventSubject(r.Node, RestoredEvent)
	h, err := envelope.Stamp(key, r.Node, r.Node, subject, body, envelope.Options{})
	if err != nil {
		return err
	}
	rec := api.AuditRecord{N: 1, Subject: subject, Headers: validHeaders(h), Body: body, Received: time.Now().UTC(),
		EventID: h.Get(envelope.EventID), Source: r.Node, Signed: true, SourceMatches: true}
	return db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRecords, bucketIDs, bucketBySource, bucketBySubject, bucketByTime, bucketMeta, bucketUsage, bucketKeys} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if hd := readHead(tx); hd.N > 0 {
			if first, ok := restoredFrom(tx); ok && first.Snapshot == r.Snapshot {
				return nil
			}
			return fmt.Errorf("the audit log of node %s holds %d records already, and does not begin with this restore: restore into a fresh --data-dir", r.Node, hd.N)
		}
		b := encodeRecord(&rec) // sets rec.Hash
		if err := tx.Bucket(bucketRecords).Put(u64(1), b); err != nil {
			return err
		}
		if err := tx.Bucket(bucketIDs).Put(keyPart(rec.EventID), u64(1)); err != nil {
			return err
		}
		if err := index(tx, rec); err != nil {
			return err
		}
		if err := indexByTime(tx, rec.Received, 1, 1); err != nil {
			return err
		}
		head, _ := json.Marshal(head{N: 1, Hash: rec.Hash})
		return tx.Bucket(bucketMeta).Put([]byte("head"), head)
	})
}

// restoredFrom is what the log's first record says of the snapshot it was restored from;
// false when the log does not begin with a restore (or was pruned past it).
func restoredFrom(tx *bolt.Tx) (api.AuditRestored, bool) {
	raw := tx.Bucket(bucketRecords).Get(u64(1))
	if raw == nil {
		return api.AuditRestored{}, false
	}
	rec, _, err := decodeRecord(raw)
	if err != nil || manifest.NodeEventSubject(rec.Source, RestoredEvent) != rec.Subject {
		return api.AuditRestored{}, false
	}
	var r api.AuditRestored
	if json.Unmarshal(rec.Body, &r) != nil || r.Node != rec.Source {
		return api.AuditRestored{}, false
	}
	return r, true
}
