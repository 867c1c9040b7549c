package dashboard

import (
	"fmt"
	"slices"
	"testing"

	"github.com/meshnode/meshnode/api"
)

// sliceLog is an audit log of records 1…n in memory; every kth is not genuine.
type sliceLog struct{ n, k uint64 }

func (sliceLog) Changes() uint64               { return 0 }
func (sliceLog) NotGenuine() map[string]uint64 { return nil }

// Query answers Last and Before as audit.Logger does: the newest Last before Before, oldest first.
func (l sliceLog) Query(f api.AuditFilter) ([]api.AuditRecord, error) {
	var out []api.AuditRecord
	top := l.n
	if f.Before > 0 {
		top = min(top, f.Before-1)
	}
	for n := top; n >= 1 && len(out) < f.Last; n-- {
		r := api.AuditRecord{N: n, Subject: "mesh.mod.shop.event.sold", Source: "shop"}
		if n%l.k == 0 {
			r.NotGenuine = "bad-signature"
		}
		out = append(out, r)
	}
	slices.Reverse(out)
	return out, nil
}

// TestSearchAudit pages back through the log, newest first, and finds the records that are
// not genuine however far apart, within its bound.
func TestSearchAudit(t *testing.T) {
	d := &Dashboard{cfg: Config{Audit: sliceLog{n: 250, k: 1000}}}
	ns := func(p AuditPage) string {
		var out []uint64
		for _, r := range p.Records {
			out = append(out, r.N)
		}
		return fmt.Sprint(out)
	}
	p, err := d.searchAudit(api.AuditFilter{Before: 0}, 3, false)
	if err != nil || ns(p) != "[250 249 248]" || p.Next != 248 {
		t.Fatalf("the newest page: %s next %d (%v), want [250 249 248] next 248", ns(p), p.Next, err)
	}
	p, _ = d.searchAudit(api.AuditFilter{Before: 3}, 3, false)
	if ns(p) != "[2 1]" || p.Next != 0 {
		t.Fatalf("the oldest page: %s next %d, want [2 1] and no next", ns(p), p.Next)
	}

	d.cfg.Audit = sliceLog{n: 120_000, k: 30_000} // 30000, 60000, 90000, 120000 are not genuine
	p, _ = d.searchAudit(api.AuditFilter{}, 10, true)
	if ns(p) != "[120000 90000]" || p.Next == 0 || p.Scanned < auditScanMost {
		t.Fatalf("not genuine, first search: %s next %d scanned %d; want [120000 90000], stopped at its bound with a next", ns(p), p.Next, p.Scanned)
	}
	p, _ = d.searchAudit(api.AuditFilter{Before: p.Next}, 10, true)
	if ns(p) != "[60000 30000]" || p.Next == 0 {
		t.Fatalf("not genuine, going on: %s next %d; want [60000 30000], stopped at its bound again", ns(p), p.Next)
	}
	p, _ = d.searchAudit(api.AuditFilter{Before: p.Next}, 10, true)
	if ns(p) != "[]" || p.Next != 0 {
		t.Fatalf("not genuine, to the start: %s next %d; want none and the log's start", ns(p), p.Next)
	}
	p, _ = d.searchAudit(api.AuditFilter{}, 1, true)
	if ns(p) != "[120000]" || p.Next != 120000 {
		t.Fatalf("not genuine, a page of one: %s next %d; want [120000] next 120000", ns(p), p.Next)
	}
}
