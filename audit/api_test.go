package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/nats-io/nats.go"
	bolt "go.etcd.io/bbolt"
)

// TestFit: one module's events — a body near the bus's 1 MiB limit, or many events with
// large headers — must not make a page of the audit log unreadable. The answer keeps every
// record of the page (a caller pages until a short page), leaving out the bulk of the largest
// and saying so.
func TestFit(t *testing.T) {
	record := func(n int, body, header int) api.AuditRecord {
		r := api.AuditRecord{N: uint64(n), Seq: uint64(n), Subject: "mesh.mod.m.event.tick", EventID: fmt.Sprintf("id-%d", n), Source: "m",
			Body: []byte(strings.Repeat("b", body)), Signed: true, SourceMatches: true, Hash: "h", Prev: "p",
			Headers: map[string][]string{envelope.EventID: {fmt.Sprintf("id-%d", n)}, envelope.Source: {"m"}}}
		if header > 0 {
			r.Headers["x-large"] = []string{strings.Repeat("h", header)}
		}
		return r
	}
	for _, tc := range []struct {
		name string
		recs []api.AuditRecord
	}{
		{"one body near 1 MiB", []api.AuditRecord{record(1, 10, 0), record(2, 1000<<10, 0), record(3, 10, 0)}},
		{"a page of 60 KiB headers", func() (rs []api.AuditRecord) {
			for i := range api.AuditDefaultLimit {
				rs = append(rs, record(i+1, 10, 60<<10))
			}
			return rs
		}()},
		{"a page of 60 KiB event ids", func() (rs []api.AuditRecord) {
			for i := range api.AuditDefaultLimit {
				r := record(i+1, 10, 0)
				r.EventID = strings.Repeat("i", 60<<10)
				r.Headers[envelope.EventID] = []string{r.EventID}
				rs = append(rs, r)
			}
			return rs
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := fit(api.AuditReply{Records: tc.recs})
			if len(b) > maxReply {
				t.Fatalf("the answer is %d bytes, over %d", len(b), maxReply)
			}
			var got api.AuditReply
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if got.Error != "" || len(got.Records) != len(tc.recs) {
				t.Fatalf("the answer has %d of %d records, error %q", len(got.Records), len(tc.recs), got.Error)
			}
			elided := 0
			for i, r := range got.Records {
				orig := tc.recs[i]
				if r.N != orig.N || r.Hash != orig.Hash || r.Subject != orig.Subject {
					t.Errorf("record %d answered as %+v", orig.N, r)
				}
				small := len(orig.Body) < 1<<10 && len(orig.Headers["x-large"]) == 0 && len(orig.EventID) < 1<<10
				switch {
				case r.Elided == "" && (len(r.Body) != len(orig.Body) || r.EventID != orig.EventID || len(r.Headers) != len(orig.Headers)):
					t.Errorf("record %d was cut short without saying so", r.N)
				case r.Elided != "" && small:
					t.Errorf("record %d is small, yet elided: %s", r.N, r.Elided)
				case r.Elided != "":
					elided++
				}
			}
			if elided == 0 {
				t.Error("the answer fits without leaving anything out, so the case tests nothing")
			}
		})
	}
	// An answer that fits is the reply as it is.
	small := api.AuditReply{Records: []api.AuditRecord{record(1, 10, 10)}}
	want, _ := json.Marshal(small)
	if got := fit(small); string(got) != string(want) {
		t.Errorf("a small answer was changed: %s", got)
	}
}

// TestCallProgress: a verify asked for progress answers with how far it has got before its
// verification, through a real nats-server; a node that does not answer is an error at once.
func TestCallProgress(t *testing.T) {
	db, l := openLog(t)
	l.progressEvery = 0 // every 1,024 records
	const records = 3000
	err := db.Update(func(tx *bolt.Tx) error {
		var prev string
		for i := range records {
			r := api.AuditRecord{N: uint64(i + 1), Seq: uint64(i + 1), Subject: "mesh.mod.a.event.x", Source: "a",
				EventID: fmt.Sprintf("id%d", i), Prev: prev, Signed: true, SourceMatches: true}
			r.Hash = computeHash(r)
			prev = r.Hash
			b, _ := json.Marshal(r)
			if err := tx.Bucket(bucketRecords).Put(u64(r.N), b); err != nil {
				return err
			}
		}
		b, _ := json.Marshal(head{N: records, Hash: prev, Seq: records})
		return tx.Bucket(bucketMeta).Put([]byte("head"), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := testbed.NATSServer(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := Serve(nc, "n", l)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var told []api.AuditProgress
	reply, err := CallProgress(ctx, nc, "n", api.AuditRequest{Op: "verify"}, 5*time.Second, func(p api.AuditProgress) { told = append(told, p) })
	if err != nil || reply.Verification == nil || reply.Verification.Records != records || reply.Verification.Broken != nil {
		t.Fatalf("verify: %+v %v", reply.Verification, err)
	}
	if len(told) != 2 || told[0] != (api.AuditProgress{Done: 1024, Total: records}) || told[1] != (api.AuditProgress{Done: 2048, Total: records}) {
		t.Errorf("progress told %+v, want 1024 and 2048 of %d", told, records)
	}
	// Call, which asks for no progress, hears none.
	reply, err = Call(ctx, nc, "n", api.AuditRequest{Op: "verify"})
	if err != nil || reply.Verification == nil || reply.Verification.Records != records {
		t.Fatalf("verify without progress: %+v %v", reply.Verification, err)
	}
	if _, err := CallProgress(ctx, nc, "elsewhere", api.AuditRequest{Op: "verify"}, 5*time.Second, nil); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Errorf("a node that does not answer: %v", err)
	}
}
