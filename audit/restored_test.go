package audit

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	bolt "go.etcd.io/bbolt"
)

// TestBeginRestored: a restored node's log begins with the signed record naming the
// snapshot, the events after it chain from it, verify passes and shows it; beginning again
// with the same snapshot (a resumed restore) adds nothing, and another snapshot is refused.
func TestBeginRestored(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "a.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	nodeKey, _ := nkeys.CreateServer()
	from := api.AuditRestored{Node: "n", MeshID: "m1", Snapshot: "ab12", File: "/b/mesh.snap", Created: time.Now().UTC().Truncate(time.Second),
		Heads: map[string]api.AuditHead{"n": {N: 7, Hash: "c0ffee"}}}
	if err := BeginRestored(db, nodeKey, from); err != nil {
		t.Fatal(err)
	}
	if err := BeginRestored(db, nodeKey, from); err != nil {
		t.Fatalf("BeginRestored again with the same snapshot: %v", err)
	}
	modKey, _ := nkeys.CreateUser()
	modPub, _ := modKey.PublicKey()
	nodePub, _ := nodeKey.PublicKey()
	keys := func(_, source string, _ uint64, _ time.Time) (string, bool) {
		switch source {
		case "m":
			return modPub, true
		case "n":
			return nodePub, true
		}
		return "", false
	}
	l, err := New(db, nil, "n", keys, func(subject, source string) bool { return true }, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := envelope.Stamp(modKey, "m", "n", "mesh.mod.m.event.a", []byte("{}"), envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.write([]jetstream.Msg{delivered{subject: "mesh.mod.m.event.a", header: h, data: []byte("{}"), seq: 9}}); err != nil {
		t.Fatal(err)
	}
	v, err := l.Verify()
	if err != nil || v.Broken != nil || v.FlaggedTotal != 0 || v.Records != 2 {
		t.Fatalf("verify: %+v %v; want 2 genuine records, intact", v, err)
	}
	if r := v.Restored; r == nil || r.Snapshot != from.Snapshot || r.Heads["n"] != from.Heads["n"] || !r.Created.Equal(from.Created) {
		t.Fatalf("verify shows the restore as %+v, want %+v", v.Restored, from)
	}
	recs, err := l.Query(api.AuditFilter{})
	if err != nil || len(recs) != 2 || recs[0].Subject != "mesh.node.n.event.restored" || recs[1].Prev != recs[0].Hash {
		t.Fatalf("query: %+v %v; want the restore first, the event chained to it", recs, err)
	}
	if err := envelope.Verify(recs[0].Headers, recs[0].Subject, recs[0].Body, nodePub); err != nil {
		t.Fatalf("the restore record's signature: %v", err)
	}
	other := from
	other.Snapshot = "cd34"
	if err := BeginRestored(db, nodeKey, other); err == nil || !strings.Contains(err.Error(), "holds 2 records already") {
		t.Fatalf("BeginRestored with another snapshot on a used log: %v", err)
	}
}

// TestBeginRestored_Pruned: the restored record is pruned with the records after it, whether
// its log has its entry by time (this meshnode's) or not (one restored by the build that
// indexed batches first, which left it out): verify passes after the prune either way.
func TestBeginRestored_Pruned(t *testing.T) {
	for _, withEntry := range []bool{true, false} {
		db, err := bolt.Open(filepath.Join(t.TempDir(), "a.db"), 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		nodeKey, _ := nkeys.CreateServer()
		if err := BeginRestored(db, nodeKey, api.AuditRestored{Node: "n", MeshID: "m1", Snapshot: "ab12"}); err != nil {
			t.Fatal(err)
		}
		if !withEntry {
			db.Update(func(tx *bolt.Tx) error {
				k, _ := tx.Bucket(bucketByTime).Cursor().First()
				return tx.Bucket(bucketByTime).Delete(k)
			})
		}
		modKey, _ := nkeys.CreateUser()
		modPub, _ := modKey.PublicKey()
		nodePub, _ := nodeKey.PublicKey()
		keys := func(_, source string, _ uint64, _ time.Time) (string, bool) {
			return map[string]string{"m": modPub, "n": nodePub}[source], source == "m" || source == "n"
		}
		l, err := New(db, nil, "n", keys, func(subject, source string) bool { return true }, time.Hour, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, at := range []time.Time{time.Now().Add(-2 * time.Hour), time.Now()} {
			l.clock = func() time.Time { return at }
			h, err := envelope.Stamp(modKey, "m", "n", "mesh.mod.m.event.a", []byte("{}"), envelope.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.write([]jetstream.Msg{delivered{subject: "mesh.mod.m.event.a", header: h, data: []byte("{}"), seq: uint64(i + 1)}}); err != nil {
				t.Fatal(err)
			}
		}
		l.prune()
		if v, err := l.Verify(); err != nil || !v.OK() || v.Records != 1 || l.Records() != 1 {
			t.Errorf("with its entry by time %v: after the prune, verify %+v, %v, %d records; want 1 record, intact", withEntry, v, err, l.Records())
		}
		db.Close()
	}
}
