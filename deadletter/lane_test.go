package deadletter

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// prompt bounds how long a letter may take to be written in these beds: well under
// deadWriteBudget, for which one unwritable letter used to hold every other.
const prompt = 15 * time.Second

// laneBed is a JetStream server with EVENTS, DEAD (with deadSubjects; nil: DEAD's own), a
// consumer on EVENTS per module named, and a writer with share.
type laneBed struct {
	t       *testing.T
	js      jetstream.JetStream
	w       *Writer
	written *prometheus.CounterVec
	evicted *prometheus.CounterVec
	lost    *prometheus.CounterVec

	mu      sync.Mutex
	reports []Eviction
}

func newLaneBed(t *testing.T, share int64, deadSubjects []string, modules ...string) *laneBed {
	t.Helper()
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: manifest.EventsStreamName, Subjects: manifest.EventPatterns()}); err != nil {
		t.Fatal(err)
	}
	dead := manifest.DeadStream()
	if deadSubjects == nil {
		deadSubjects = dead.Subjects
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: dead.Name, Subjects: deadSubjects, MaxMsgsPerSubject: dead.MaxMsgsPerSubject,
		Duplicates: dead.Duplicates, Discard: jetstream.DiscardNew}); err != nil {
		t.Fatal(err)
	}
	for _, m := range modules {
		if _, err := js.CreateOrUpdateConsumer(ctx, manifest.EventsStreamName, jetstream.ConsumerConfig{Durable: m,
			FilterSubject: manifest.EventSubject(m, ">"), AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: manifest.MaxDeliver}); err != nil {
			t.Fatal(err)
		}
	}
	counter := func(name string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name}, []string{"stream", "consumer"})
	}
	b := &laneBed{t: t, js: js, written: counter("written"), evicted: counter("evicted"), lost: counter("lost")}
	wc, _ := testbed.Connect(t, srv)
	w, err := OpenWriter(context.Background(), WriterConfig{Conn: wc, Logger: slog.New(slog.DiscardHandler), Share: share,
		Written: b.written, Evicted: b.evicted, Lost: b.lost, Report: func(e Eviction) {
			b.mu.Lock()
			b.reports = append(b.reports, e)
			b.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	b.w = w
	return b
}

// die emits n events of size bytes as module and has its consumer terminate each: n deaths.
func (b *laneBed) die(module string, n, size int) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range n {
		body := []byte(fmt.Sprintf("%d:%s", i, strings.Repeat("x", size)))
		if _, err := b.js.Publish(ctx, manifest.EventSubject(module, "failed"), body); err != nil {
			b.t.Fatal(err)
		}
	}
	c, err := b.js.Consumer(ctx, manifest.EventsStreamName, module)
	if err != nil {
		b.t.Fatal(err)
	}
	for got := 0; got < n; {
		batch, err := c.Fetch(n-got, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.TermWithReason("handler failed"); err != nil {
				b.t.Fatal(err)
			}
			got++
		}
		if err := batch.Error(); err != nil {
			b.t.Fatal(err)
		}
	}
}

// letters are module's letters in DEAD, oldest first, and their bytes as DEAD counts them.
func (b *laneBed) letters(module string) ([]*jetstream.RawStreamMsg, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dead, err := b.js.Stream(ctx, manifest.DeadStreamName)
	if err != nil {
		return nil, 0, err
	}
	var out []*jetstream.RawStreamMsg
	var bytes int64
	for seq := uint64(1); ; {
		m, err := dead.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(manifest.DeadSubject(manifest.EventsStreamName, module)))
		if err == jetstream.ErrMsgNotFound {
			return out, bytes, nil
		}
		if err != nil {
			return nil, 0, err
		}
		out = append(out, m)
		bytes += letterSize(m.Subject, m.Header, m.Data)
		seq = m.Sequence + 1
	}
}

// count is a counter's value for module's consumer on EVENTS.
func count(c *prometheus.CounterVec, module string) int {
	return int(testutil.ToFloat64(c.WithLabelValues(manifest.EventsStreamName, module)))
}

// TestWriter_ShareIsPerConsumer: module a's consumer dead-letters far more than its share of
// DEAD; it keeps only its newest letters within its share (its oldest removed, counted and
// reported), and module b's letters, right after, are all written at once.
func TestWriter_ShareIsPerConsumer(t *testing.T) {
	const share, size, burst = 64 << 10, 8 << 10, 60 // a's burst: some seven times its share
	b := newLaneBed(t, share, nil, "a", "b")
	b.die("a", burst, size)
	b.die("b", 3, 100)

	testbed.RetryUntil(t, prompt, func() error {
		if got := count(b.written, "b"); got != 3 {
			return fmt.Errorf("b: %d letters written, want 3", got)
		}
		return nil
	})
	letters, _, err := b.letters("b")
	if err != nil || len(letters) != 3 {
		t.Fatalf("b holds %d letters in DEAD (%v), want its 3: nothing accepted is lost", len(letters), err)
	}
	testbed.RetryUntil(t, prompt, func() error {
		if got := count(b.written, "a"); got != burst {
			return fmt.Errorf("a: %d letters written, want %d", got, burst)
		}
		return nil
	})
	letters, used, err := b.letters("a")
	if err != nil {
		t.Fatal(err)
	}
	if used > share {
		t.Errorf("a holds %d bytes of DEAD in %d letters, over its share of %d", used, len(letters), share)
	}
	if len(letters) == 0 || !strings.HasPrefix(string(letters[len(letters)-1].Data), fmt.Sprintf("%d:", burst-1)) {
		t.Errorf("a's newest death is not in DEAD: its oldest letters are to go, not its newest")
	}
	if got, want := count(b.evicted, "a"), burst-len(letters); got != want {
		t.Errorf("a: %d evictions counted, want %d (%d written, %d kept)", got, want, burst, len(letters))
	}
	if got := count(b.evicted, "b") + count(b.lost, "b") + count(b.lost, "a"); got != 0 {
		t.Errorf("%d of b's letters evicted or letters lost, want none", got)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.reports) == 0 || b.reports[0].Consumer != "a" || b.reports[0].Letters == 0 || b.reports[0].Share != share {
		t.Errorf("evictions reported %+v, want a's, with its share", b.reports)
	}
}

// TestWriter_UnwritableHoldsNoOther: a letter DEAD cannot take — one larger than a share,
// never; one for a subject DEAD does not capture, retried for a minute — holds no other
// consumer's letter.
func TestWriter_UnwritableHoldsNoOther(t *testing.T) {
	t.Run("larger than a share", func(t *testing.T) {
		b := newLaneBed(t, 16<<10, nil, "a", "b")
		b.die("a", 1, 32<<10)
		b.die("b", 1, 100)
		testbed.RetryUntil(t, prompt, func() error {
			if got := count(b.lost, "a"); got != 1 {
				return fmt.Errorf("a's letter larger than its share: %d lost, want 1", got)
			}
			if got := count(b.written, "b"); got != 1 {
				return fmt.Errorf("b: %d letters written, want 1", got)
			}
			return nil
		})
	})
	t.Run("retried", func(t *testing.T) {
		b := newLaneBed(t, 64<<10, []string{manifest.DeadSubject(manifest.EventsStreamName, "b")}, "a", "b")
		b.die("a", 2, 100)
		b.die("b", 2, 100)
		testbed.RetryUntil(t, prompt, func() error {
			if got := count(b.written, "b"); got != 2 {
				return fmt.Errorf("b: %d letters written behind a's unwritable ones, want 2", got)
			}
			return nil
		})
		if got := count(b.written, "a") + count(b.lost, "a"); got != 0 {
			t.Errorf("a's letters, which DEAD does not capture: %d written or lost already, want them still retried", got)
		}
	})
}

// TestLane_Wrote: the ledger keeps a consumer's letters in order once, whichever node wrote
// them first.
func TestLane_Wrote(t *testing.T) {
	l := &lane{read: true}
	for _, seq := range []uint64{3, 7, 5, 7, 3} {
		l.wrote(seq, int64(seq))
	}
	if got := fmt.Sprint(l.ledger); got != "[{3 3} {5 5} {7 7}]" || l.used != 15 {
		t.Errorf("ledger %s, %d bytes; want 3, 5, 7 once each", got, l.used)
	}
	unread := &lane{}
	unread.wrote(1, 1)
	if len(unread.ledger) != 0 {
		t.Errorf("a lane that has not read its ledger recorded %v", unread.ledger)
	}
}

// TestLetterSize: what the writer counts of a letter is what DEAD counts.
func TestLetterSize(t *testing.T) {
	srv := testbed.NATSServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	_, js := testbed.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: "s.one", Header: nats.Header{"X-A": {" padded ", "two"}, "X-Dead-Reason": {"boom"}}, Data: []byte("body")}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := letterSize(m.Subject, m.Header, m.Data), int64(info.State.Bytes); got != want {
		t.Errorf("letterSize = %d, DEAD counts %d", got, want)
	}
}
