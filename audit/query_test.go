package audit

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/meshnode/meshnode/api"
	bolt "go.etcd.io/bbolt"
)

// openLog opens a logger on a new store, with no bus: tests write its records themselves.
func openLog(t *testing.T) (*bolt.DB, *Logger) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "a.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	l, err := New(db, nil, "n", nil, nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return db, l
}

// TestQuery_Indexes writes records straight to a store and queries through each index.
func TestQuery_Indexes(t *testing.T) {
	db, l := openLog(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	subjects := []string{"mesh.mod.a.event.x", "mesh.mod.b.event.y", "mesh.mod.a.event.z.w"}
	err := db.Update(func(tx *bolt.Tx) error {
		var prev string
		for i := range 30 {
			src := string(rune('a' + i%2))
			r := api.AuditRecord{N: uint64(i + 1), Seq: uint64(i + 1), Subject: subjects[i%3], Source: src, EventID: "id" + string(rune('A'+i)),
				Received: base.Add(time.Duration(i) * time.Minute), Prev: prev, Signed: true, SourceMatches: true}
			r.Hash = computeHash(r)
			prev = r.Hash
			b, _ := json.Marshal(r)
			tx.Bucket(bucketRecords).Put(u64(r.N), b)
			tx.Bucket(bucketIDs).Put([]byte(r.EventID), u64(r.N))
			if err := index(tx, r); err != nil {
				return err
			}
		}
		b, _ := json.Marshal(head{N: 30, Hash: prev, Seq: 30})
		return tx.Bucket(bucketMeta).Put([]byte("head"), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    api.AuditFilter
		want []uint64
	}{
		{"id", api.AuditFilter{ID: "idC"}, []uint64{3}},
		{"source paged", api.AuditFilter{Source: "b", After: 20, Limit: 3}, []uint64{22, 24, 26}},
		{"source last", api.AuditFilter{Source: "a", Last: 2}, []uint64{27, 29}},
		{"pattern", api.AuditFilter{Event: "a.**", Limit: 4}, []uint64{1, 3, 4, 6}},
		{"pattern one name", api.AuditFilter{Event: "*.y", After: 20}, []uint64{23, 26, 29}},
		{"time", api.AuditFilter{Since: base.Add(25 * time.Minute), Until: base.Add(28 * time.Minute)}, []uint64{26, 27, 28}},
		{"last", api.AuditFilter{Last: 2}, []uint64{29, 30}},
		{"last before", api.AuditFilter{Last: 3, Before: 12}, []uint64{9, 10, 11}},
		{"last before past the end", api.AuditFilter{Last: 2, Before: 99}, []uint64{29, 30}},
		{"source last before", api.AuditFilter{Source: "b", Last: 2, Before: 20}, []uint64{16, 18}},
		{"source last before one of another source", api.AuditFilter{Source: "a", Last: 2, Before: 20}, []uint64{17, 19}},
		{"pattern last before", api.AuditFilter{Event: "*.y", Last: 2, Before: 20}, []uint64{14, 17}},
		{"before, forwards", api.AuditFilter{After: 3, Before: 6}, []uint64{4, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := l.Query(tc.f)
			if err != nil {
				t.Fatal(err)
			}
			var got []uint64
			for _, r := range recs {
				got = append(got, r.N)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
	// The chain is intact; the hand-made ids ("idA") are not UUIDv7s, each flagged as such.
	v, err := l.Verify()
	if err != nil || v.Broken != nil || v.Records != 30 || v.FlaggedTotal != 30 || v.Flagged[0].Kind != api.AuditFlagBadID {
		t.Fatalf("verify: %+v %v", v, err)
	}

	// Removing records from either end breaks the chain.
	for _, n := range []uint64{30, 1} {
		db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketRecords).Delete(u64(n)) })
		v, err := l.Verify()
		if err != nil || v.Broken == nil {
			t.Fatalf("verify after removing record %d: %+v %v", n, v, err)
		}
	}
}

// TestVerify_FlagsFitAMessage: events whose emitter-chosen fields are huge are flagged with
// those fields cut short, so the answer stays small and Broken can always be told.
func TestVerify_FlagsFitAMessage(t *testing.T) {
	db, l := openLog(t)
	huge := strings.Repeat("é", 30_000) // 60 KB of a source nobody registered
	err := db.Update(func(tx *bolt.Tx) error {
		var prev string
		for i := range 40 {
			r := api.AuditRecord{N: uint64(i + 1), Seq: uint64(i + 1), Subject: "mesh.mod.a.event.x", Source: huge,
				EventID: fmt.Sprintf("%s-%d", huge, i), SignatureError: "no registered key for source " + huge, Prev: prev}
			r.Hash = computeHash(r)
			prev = r.Hash
			b, _ := json.Marshal(r)
			tx.Bucket(bucketRecords).Put(u64(r.N), b)
		}
		b, _ := json.Marshal(head{N: 40, Hash: prev, Seq: 40})
		return tx.Bucket(bucketMeta).Put([]byte("head"), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	v, err := l.Verify()
	if err != nil || v.Broken != nil || v.FlaggedTotal != 40 || len(v.Flagged) != 40 {
		t.Fatalf("verify: broken %v, %d of %d flagged, %v", v.Broken, len(v.Flagged), v.FlaggedTotal, err)
	}
	b, _ := json.Marshal(api.AuditReply{Verification: &v})
	if len(b) > maxReply/4 {
		t.Errorf("the verification is %d bytes", len(b))
	}
	if f := v.Flagged[0]; len(f.Source) > flagKeep+len("…") || !utf8.ValidString(f.Source) || !strings.HasSuffix(f.Source, "…") {
		t.Errorf("a flag's source: %d bytes", len(f.Source))
	}
}
