package node

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/embedbus"
)

// TestConnRates_Sample: a connection over the rate is found once it has sent a second's worth
// beyond it — in the first sample at forty times the rate, after a second at twice; one that
// answers as much as it is sent never is, nor the operator; and the answerer of a barred
// flood, still answering its backlog on a new connection, is forgiven for floodGrace.
func TestConnRates_Sample(t *testing.T) {
	const rate = 1000
	module := func(key string) bool { return key != "operator" }
	r := connRates{last: map[uint64]connSample{}}
	t0 := time.Unix(1_000_000, 0)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * floodSample) }
	sample := func(i int, stats ...embedbus.ClientStat) (rateOver, bool) {
		return r.sample(stats, at(i), rate, module)
	}

	// Connected: the first sample is where counting starts.
	sample(0, embedbus.ClientStat{ID: 1, Key: "flooder"}, embedbus.ClientStat{ID: 2, Key: "holder"},
		embedbus.ClientStat{ID: 3, Key: "steady"}, embedbus.ClientStat{ID: 4, Key: "operator"})
	// A quarter of a second later: the flooder sent 10,000 (40 times the rate), the holder
	// answered 8,000 of them, steady sent 200 (under the rate), the operator 50,000.
	over, ok := sample(1,
		embedbus.ClientStat{ID: 1, Key: "flooder", InMsgs: 10000, OutMsgs: 8000},
		embedbus.ClientStat{ID: 2, Key: "holder", InMsgs: 8000, OutMsgs: 10000},
		embedbus.ClientStat{ID: 3, Key: "steady", InMsgs: 200},
		embedbus.ClientStat{ID: 4, Key: "operator", InMsgs: 50000})
	if !ok || over.key != "flooder" || over.msgs != 10000 {
		t.Fatalf("found %+v (%v), want the flooder with its 10,000", over, ok)
	}
	// The flooder is gone; the holder answers its backlog on a new connection, with nothing
	// sent to it there: forgiven.
	for i := 2; i < 2+int(floodGrace/floodSample)-1; i++ {
		if over, ok := sample(i, embedbus.ClientStat{ID: 5, Key: "holder", InMsgs: int64(i) * 5000},
			embedbus.ClientStat{ID: 3, Key: "steady", InMsgs: 200 + int64(i)*200}); ok {
			t.Fatalf("sample %d found %+v: the holder answering its backlog, or steady", i, over)
		}
	}
	// A flood at twice the rate is found once it has sent a second's worth beyond it.
	r = connRates{last: map[uint64]connSample{}}
	found := -1
	for i := range 12 {
		if _, ok := sample(i, embedbus.ClientStat{ID: 6, Key: "flooder", InMsgs: int64(i) * 2 * rate / 4}); ok && found < 0 {
			found = i
		}
	}
	if found < 4 || found > 5 {
		t.Fatalf("a flood at twice the rate found at sample %d, want after a second of it (sample 4 or 5)", found)
	}
}
