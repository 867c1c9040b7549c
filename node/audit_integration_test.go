//go:build integration

package node_test

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
)

// TestIntegration_Audit_Completeness: 100,000 events from several modules, 1% re-published: the audit
// log has exactly the distinct events, each once, in stream order, and the chain verifies.
func TestIntegration_Audit_Completeness(t *testing.T) {
	cfg := testConfig(t.TempDir(), "alpha")
	// Raw clients as fast as they send, which do not retry a refusal: neither the pace, nor the
	// back-pressure (BenchmarkAuditSustained is the back-pressure's), nor the flood watch,
	// which bars a connection past flood-rate, is what this bed counts.
	cfg.EmitRate, cfg.AuditMaxLag, cfg.FloodRate = 0, 0, 0
	b := newBedAt(t, cfg)
	const perModule = 100_000 / 4
	modules := []string{"m1", "m2", "m3", "m4"}
	sent := map[string][]string{}
	for _, m := range modules {
		seed, _ := b.register("module: " + m + "\nrequires: [mesh-bus]\nemits: [tick]\n")
		sent[m] = publishRaw(t, b, seed, m, "tick", perModule, 100)
	}
	b.waitAudited(120 * time.Second)
	var lastSeq, lastN uint64
	for _, m := range modules {
		recs := b.auditAll(m)
		if len(recs) != perModule {
			t.Fatalf("%s: %d records, want %d distinct events", m, len(recs), perModule)
		}
		seen := map[string]bool{}
		for i, r := range recs {
			if seen[r.EventID] {
				t.Fatalf("%s: event %s recorded twice", m, r.EventID)
			}
			seen[r.EventID] = true
			if r.EventID != sent[m][i] {
				t.Fatalf("%s: record %d is event %s, sent %s: not in order", m, i, r.EventID, sent[m][i])
			}
			if !r.Signed || !r.SourceMatches {
				t.Fatalf("%s: record %d flagged: %s", m, r.N, r.SignatureError)
			}
			if i > 0 && (r.Seq <= lastSeq || r.N <= lastN) {
				t.Fatalf("%s: record %d (seq %d) after seq %d: not in stream order", m, r.N, r.Seq, lastSeq)
			}
			lastSeq, lastN = r.Seq, r.N
		}
	}
	v := b.audit(api.AuditRequest{Op: "verify"}).Verification
	if !v.OK() {
		t.Fatalf("verify: %+v %+v", v.Broken, v.Flagged)
	}
}
