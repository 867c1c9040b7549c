package audit

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/envelope"
)

// TestFit: one module's events — a body near the bus's 1 MiB limit, or many events with
// large headers — must not make a page of the audit log unreadable. The answer keeps every
// record of the page (a caller pages until a short page), leaving out the bulk of the largest
// and saying so.
func TestFit(t *testing.T) {
	record := func(n int, body, header int) Record {
		r := Record{N: uint64(n), Seq: uint64(n), Subject: "mesh.mod.m.event.tick", EventID: fmt.Sprintf("id-%d", n), Source: "m",
			Body: []byte(strings.Repeat("b", body)), Signed: true, SourceMatches: true, Hash: "h", Prev: "p",
			Headers: map[string][]string{envelope.EventID: {fmt.Sprintf("id-%d", n)}, envelope.Source: {"m"}}}
		if header > 0 {
			r.Headers["x-large"] = []string{strings.Repeat("h", header)}
		}
		return r
	}
	for _, tc := range []struct {
		name string
		recs []Record
	}{
		{"one body near 1 MiB", []Record{record(1, 10, 0), record(2, 1000<<10, 0), record(3, 10, 0)}},
		{"a page of 60 KiB headers", func() (rs []Record) {
			for i := range DefaultLimit {
				rs = append(rs, record(i+1, 10, 60<<10))
			}
			return rs
		}()},
		{"a page of 60 KiB event ids", func() (rs []Record) {
			for i := range DefaultLimit {
				r := record(i+1, 10, 0)
				r.EventID = strings.Repeat("i", 60<<10)
				r.Headers[envelope.EventID] = []string{r.EventID}
				rs = append(rs, r)
			}
			return rs
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := fit(Reply{Records: tc.recs})
			if len(b) > maxReply {
				t.Fatalf("the answer is %d bytes, over %d", len(b), maxReply)
			}
			var got Reply
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
	small := Reply{Records: []Record{record(1, 10, 10)}}
	want, _ := json.Marshal(small)
	if got := fit(small); string(got) != string(want) {
		t.Errorf("a small answer was changed: %s", got)
	}
}
