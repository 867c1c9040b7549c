package floodwatch

import (
	"testing"
	"time"
)

// TestRates_Sample: a connection over the rate is found once it has sent Burst's worth
// beyond it — in the first sample at forty times the rate, after a quarter of a second at
// twice, draining meanwhile; one that answers as much as it is sent never is, nor the
// operator; and the answerer of a barred flood, still answering its backlog on a new
// connection, is forgiven for Grace.
func TestRates_Sample(t *testing.T) {
	const rate = 1000
	module := func(key string) bool { return key != "operator" }
	r := Rates{}
	t0 := time.Unix(1_000_000, 0)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * Sample) }
	sample := func(i int, stats ...ConnStat) (Over, bool) {
		over, found, _ := r.Sample(stats, at(i), rate, module)
		return over, found
	}

	// Connected: the first sample is where counting starts.
	sample(0, ConnStat{ID: 1, Key: "flooder"}, ConnStat{ID: 2, Key: "holder"},
		ConnStat{ID: 3, Key: "steady"}, ConnStat{ID: 4, Key: "operator"})
	// A quarter of a second later: the flooder sent 10,000 (40 times the rate), the holder
	// answered 8,000 of them, steady sent 200 (under the rate), the operator 50,000.
	over, ok := sample(1,
		ConnStat{ID: 1, Key: "flooder", InMsgs: 10000, OutMsgs: 8000},
		ConnStat{ID: 2, Key: "holder", InMsgs: 8000, OutMsgs: 10000},
		ConnStat{ID: 3, Key: "steady", InMsgs: 200},
		ConnStat{ID: 4, Key: "operator", InMsgs: 50000})
	if !ok || over.Key != "flooder" || over.Msgs != 10000 {
		t.Fatalf("found %+v (%v), want the flooder with its 10,000", over, ok)
	}
	// The flooder is gone; the holder answers its backlog on a new connection, with nothing
	// sent to it there: forgiven.
	for i := 2; i < 2+int(Grace/Sample)-1; i++ {
		if over, ok := sample(i, ConnStat{ID: 5, Key: "holder", InMsgs: int64(i) * 5000},
			ConnStat{ID: 3, Key: "steady", InMsgs: 200 + int64(i)*200}); ok {
			t.Fatalf("sample %d found %+v: the holder answering its backlog, or steady", i, over)
		}
	}
	// A flood at twice the rate, read a peek apart, is found once it has sent Burst's worth
	// beyond it (250 at 25 a peek over the rate), and is draining once it has spent half of
	// it; a connection under the rate never drains.
	r = Rates{}
	found := -1
	for i := range 16 {
		stats := []ConnStat{{ID: 6, Key: "flooder", InMsgs: int64(i) * 2 * rate * int64(Peek) / int64(time.Second)},
			{ID: 7, Key: "steady", InMsgs: int64(i) * rate / 2 * int64(Peek) / int64(time.Second)}}
		_, ok, draining := r.Sample(stats, t0.Add(time.Duration(i)*Peek), rate, module)
		if ok && found < 0 {
			found = i
		}
		if half := i > 5; found < 0 && draining != half { // 250 - 25i < 125 from peek 6
			t.Fatalf("peek %d: the flooder at twice the rate draining %v, want %v", i, draining, half)
		}
	}
	if found < 10 || found > 11 { // 10: the bucket at zero, give or take a float's rounding
		t.Fatalf("a flood at twice the rate found at peek %d, want after a quarter of a second of it (peek 10 or 11)", found)
	}
	// A module steady at half the rate, listed every Sample, may burst three fifths of its
	// bucket on top: the refill of the quarter second it sent in is counted before the cap.
	r = Rates{}
	var sent int64
	for i := range 8 {
		sent += rate / 2 * int64(Sample) / int64(time.Second)
		if i == 4 {
			sent += 150
		}
		if over, ok := sample(i, ConnStat{ID: 8, Key: "bursty", InMsgs: sent}); ok {
			t.Fatalf("sample %d found %+v: a burst within the bucket on top of half the rate", i, over)
		}
	}
	r = Rates{}
	for i := range 16 {
		if _, _, draining := r.Sample([]ConnStat{{ID: 7, Key: "steady", InMsgs: int64(i) * 20}}, t0.Add(time.Duration(i)*Peek), rate, module); draining {
			t.Fatalf("peek %d: a connection at 0.8 of the rate is draining", i)
		}
	}
}

// TestSchedule: the connections are listed every Sample; sooner, at a peek, when
// the modules together sent more than one connection may; an early list that finds nobody
// doubles the wait before the next early one, and a quiet spell or a flooder found brings
// it back to a peek.
func TestSchedule(t *testing.T) {
	const rate = 1000 // 25 a peek
	t0 := time.Unix(1_000_000, 0)
	w := Schedule{}
	var total int64
	step := func(i int, sent int64) (time.Time, bool) {
		now := t0.Add(time.Duration(i) * Peek)
		total += sent
		return now, w.Due(total, now, rate)
	}
	now, due := step(0, 0)
	if !due {
		t.Fatal("the first peek does not list: want a list to count from")
	}
	w.Walked(now, false)
	// Quiet: listed only every Sample.
	for i := 1; i < int(Sample/Peek); i++ {
		if _, due := step(i, 10); due {
			t.Fatalf("quiet peek %d lists", i)
		}
	}
	now, due = step(int(Sample/Peek), 10)
	if !due {
		t.Fatal("no list after Sample")
	}
	w.Walked(now, false)
	// Busy, nobody over: early lists at a peek, then two, four... apart.
	base := int(Sample / Peek)
	var early []int
	for i := base + 1; i < base+int(Sample/Peek); i++ {
		now, due := step(i, 100)
		if due {
			early = append(early, i-base)
			w.Walked(now, false)
		}
	}
	if len(early) < 3 || early[0] != 1 || early[1] != 3 || early[2] != 7 {
		t.Fatalf("early lists of a busy mesh at peeks %v, want 1, 3, 7 (the wait doubling)", early)
	}
	// A flooder found: back to a peek.
	i := base + int(Sample/Peek)
	for ; ; i++ {
		now, due := step(i, 100)
		if due {
			w.Walked(now, true)
			break
		}
	}
	if _, due := step(i+1, 100); !due {
		t.Fatal("the peek after a flooder was found does not list")
	}
}

// TestRates_AnswererFoundBeforeItAnswers: found within a peek of the flood's start, the
// flooder is barred before its answerer has sent much — but much was delivered to it, so it
// is forgiven too, and its answers to the backlog after the bar do not bar it.
func TestRates_AnswererFoundBeforeItAnswers(t *testing.T) {
	const rate = 1000
	module := func(string) bool { return true }
	r := Rates{}
	t0 := time.Unix(1_000_000, 0)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * Peek) }
	r.Sample([]ConnStat{{ID: 1, Key: "flooder"}, {ID: 2, Key: "holder"}}, at(0), rate, module)
	// A peek later: 5,000 requests sent, 4,000 delivered to the holder, 10 answered.
	over, ok, _ := r.Sample([]ConnStat{{ID: 1, Key: "flooder", InMsgs: 5000, OutMsgs: 10},
		{ID: 2, Key: "holder", InMsgs: 10, OutMsgs: 4000}}, at(1), rate, module)
	if !ok || over.Key != "flooder" {
		t.Fatalf("found %+v (%v), want the flooder", over, ok)
	}
	// The holder answers its backlog, 4,000 in the next peek: forgiven.
	if over, ok, _ := r.Sample([]ConnStat{{ID: 2, Key: "holder", InMsgs: 4010, OutMsgs: 4000}}, at(2), rate, module); ok {
		t.Fatalf("found %+v: the holder answering what it was sent", over)
	}
}
