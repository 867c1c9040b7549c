package dashboard

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/meshnode/meshnode/api"
)

// Bounds of an audit search.
const (
	auditPageMost = 500    // records a page holds at most
	auditScanMost = 50_000 // records one search reads at most while it looks for records that are not genuine
	auditScanPage = 2_000  // records read at a time while looking
)

// AuditPage answers GET /ui/api/audit: the newest matching records before Before (newest
// first), and where the next older page starts (Next, 0 when there is none). Scanned says
// how far back a search for records that are not genuine read; Next then lets it go on.
type AuditPage struct {
	Records []AuditRecord `json:"records"`
	Next    uint64        `json:"next,omitempty"`
	Scanned uint64        `json:"scanned,omitempty"`
}

// auditSearch searches the node's audit log beyond the snapshot's newest 50: by source, by
// event pattern (as `audit query --event`), by time (since, until: RFC 3339), and for the
// records that are not genuine events (not_genuine=1), a page at a time back from before.
func (d *Dashboard) auditSearch(w http.ResponseWriter, r *http.Request, _ *session) {
	q := r.URL.Query()
	f := api.AuditFilter{Source: q.Get("source"), Event: q.Get("event")}
	bad := func(what string, err error) {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("GET /ui/api/audit: %s: %v", what, err)})
	}
	for _, t := range []struct {
		name string
		at   *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(t.name); v != "" {
			at, err := time.Parse(time.RFC3339, v)
			if err != nil {
				bad(t.name+" is not an RFC 3339 time (2026-12-06T10:00:00Z)", err)
				return
			}
			*t.at = at
		}
	}
	limit := 100
	for _, n := range []struct {
		name string
		to   *uint64
	}{{"before", &f.Before}, {"limit", nil}} {
		if v := q.Get(n.name); v != "" {
			u, err := strconv.ParseUint(v, 10, 64)
			if err != nil || u == 0 {
				bad(n.name+" is a positive whole number", cmp.Or(err, fmt.Errorf("%q", v)))
				return
			}
			if n.to != nil {
				*n.to = u
			} else {
				limit = int(min(u, auditPageMost))
			}
		}
	}
	page, err := d.searchAudit(f, limit, q.Get("not_genuine") == "1")
	if err != nil {
		bad("the search", err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// searchAudit reads one page of records matching f, newest first, before f.Before; only the
// records that are not genuine when notGenuine is set (read auditScanPage at a time, at most
// auditScanMost).
func (d *Dashboard) searchAudit(f api.AuditFilter, limit int, notGenuine bool) (AuditPage, error) {
	page := AuditPage{Records: []AuditRecord{}}
	for {
		f.Last = limit + 1 // one more: whether an older page exists
		if notGenuine {
			f.Last = auditScanPage
		}
		recs, err := d.cfg.Audit.Query(f)
		if err != nil {
			return page, err
		}
		for _, r := range slices.Backward(recs) {
			if len(page.Records) == limit {
				page.Next = page.Records[limit-1].N
				return page, nil
			}
			if notGenuine {
				page.Scanned++
				if r.NotGenuine == "" {
					continue
				}
			}
			page.Records = append(page.Records, auditRecordOf(r))
		}
		if len(recs) < f.Last || !notGenuine {
			return page, nil // the log's start
		}
		f.Before = recs[0].N
		if page.Scanned >= auditScanMost {
			page.Next = f.Before
			return page, nil
		}
	}
}
