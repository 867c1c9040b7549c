package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const mailerManifest = `module: mailer
requires: [mesh-bus]
seats:
  mailer:
    scope: mesh
    retain: 1h
    accepts: [send]
    emits: [delivered]
`

const shopManifest = "module: shop\nrequires: [mesh-bus]\nuses: [mailer]\n"

// jobLog records which instance handled which job.
type jobLog struct {
	mu    sync.Mutex
	by    map[string][]string // instance → job ids
	count map[string]int      // job id → times handled
}

func newJobLog() *jobLog { return &jobLog{by: map[string][]string{}, count: map[string]int{}} }

func (l *jobLog) handler(instance string) sdk.JobHandler {
	return func(_ context.Context, j sdk.Job) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.by[instance] = append(l.by[instance], j.ID)
		l.count[j.ID]++
		return nil
	}
}

func (l *jobLog) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.count)
}

// holder waits until exactly one of the clients holds seat and returns it.
func holder(t *testing.T, seat string, cs ...*sdk.Client) *sdk.Client {
	t.Helper()
	var h *sdk.Client
	retryUntil(t, 10*time.Second, func() error {
		h = nil
		for _, c := range cs {
			if ok, _ := c.Holding(seat); ok {
				if h != nil {
					return errors.New("two instances hold " + seat)
				}
				h = c
			}
		}
		if h == nil {
			return errors.New("nobody holds " + seat)
		}
		return nil
	})
	return h
}

func submit(t *testing.T, c *sdk.Client, seat, verb string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, n)
	for i := range n {
		id, err := c.Submit(ctx, seat, verb, map[string]int{"job": i})
		if err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
		ids[i] = id
	}
	return ids
}

// TestSeat_OneHolderOneDelivery: with two instances of the holding module, 1,000 jobs are each
// handled once, all by the holder; a second instance cannot pull the queue; a second module
// declaring the seat is refused.
func TestSeat_OneHolderOneDelivery(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mailerSeed, _ := b.register(mailerManifest)
	shopSeed, _ := b.register(shopManifest)
	log := newJobLog()
	c1, c2 := b.client(mailerSeed), b.client(mailerSeed)
	for _, c := range []*sdk.Client{c1, c2} {
		if err := c.Accept("send", log.handler(c.Instance())); err != nil {
			t.Fatal(err)
		}
	}
	h := holder(t, "mailer", c1, c2)
	other := c1
	if h == c1 {
		other = c2
	}

	ids := submit(t, b.client(shopSeed), "mailer", "send", 1000)
	retryUntil(t, 30*time.Second, func() error {
		if n := log.distinct(); n != len(ids) {
			return fmt.Errorf("%d of %d jobs handled", n, len(ids))
		}
		return nil
	})
	log.mu.Lock()
	for _, id := range ids {
		if n := log.count[id]; n != 1 {
			t.Errorf("job %s handled %d times", id, n)
		}
	}
	if got := len(log.by[h.Instance()]); got != len(ids) {
		t.Errorf("holder handled %d jobs, want %d", got, len(ids))
	}
	if got := len(log.by[other.Instance()]); got != 0 {
		t.Errorf("the other instance handled %d jobs, want 0", got)
	}
	log.mu.Unlock()

	// The bus refuses the non-holder's pull: the queue is the holder's alone.
	stale := connect(t, b.n.ClientURL(), mailerSeed, nats.Name(other.Instance()), nats.CustomInboxPrefix("_INBOX.mailer"))
	defer stale.Close()
	for _, s := range []string{"$JS.API.CONSUMER.MSG.NEXT.SEAT_mailer.seat-mailer", "$JS.ACK.SEAT_mailer.seat-mailer.1.1.1.1.1", "mesh.seat.mailer.event.delivered"} {
		if !refusedPub(t, stale, s) {
			t.Errorf("non-holder instance published on %s", s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := admin.Register(ctx, b.op, []byte("module: mailer2\nrequires: [mesh-bus]\nseats:\n  mailer: {scope: mesh, retain: 1h, accepts: [send]}\n")); !errors.Is(err, admin.ErrRefused) {
		t.Fatalf("second module declaring seat mailer: %v, want refused", err)
	}
}

// TestSeat_QueuedWorkSurvivesNoHolder: 100 jobs submitted while nobody holds the seat are all
// delivered once a holder starts.
func TestSeat_QueuedWorkSurvivesNoHolder(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mailerSeed, _ := b.register(mailerManifest)
	shopSeed, _ := b.register(shopManifest)
	ids := submit(t, b.client(shopSeed), "mailer", "send", 100)
	st := seatStatus(t, b, "mailer")
	if st.Holder != "" || st.Backlog != 100 || len(st.Users) != 1 || st.Users[0] != "shop" || st.Module != "mailer" {
		t.Fatalf("seat status before a holder: %+v", st)
	}
	log := newJobLog()
	c := b.client(mailerSeed)
	if err := c.Accept("send", log.handler(c.Instance())); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		if n := log.distinct(); n != len(ids) {
			return fmt.Errorf("%d of %d queued jobs delivered", n, len(ids))
		}
		return nil
	})
	retryUntil(t, 5*time.Second, func() error {
		st = seatStatus(t, b, "mailer")
		if st.Holder != "mailer/"+c.Instance() || st.HolderAt != "alpha" || st.Epoch == 0 || st.Backlog != 0 {
			return fmt.Errorf("seat status with a holder: %+v", st)
		}
		return nil
	})
}

// seatStatus asks the controller for one seat's status, as `meshnode seat ls` does.
func seatStatus(t *testing.T, b *bed, seat string) api.SeatStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := b.op.RequestWithContext(ctx, api.SeatListSubject, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	var reply api.SeatListReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		t.Fatal(err)
	}
	for _, s := range reply.Seats {
		if s.Seat == seat {
			return s
		}
	}
	t.Fatalf("seat %s not listed: %s", seat, msg.Data)
	return api.SeatStatus{}
}

// TestSeat_HolderDiesMidJob: the holder takes a job and its connection drops without an ack;
// the job is redelivered to the next holder, nothing is lost, and the stale holder's late
// ack and publish are refused.
func TestSeat_HolderDiesMidJob(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mailerSeed, _ := b.register(mailerManifest)
	shopSeed, _ := b.register(shopManifest)

	stuck := make(chan sdk.Job, 1)
	first := b.client(mailerSeed)
	if err := first.Accept("send", func(ctx context.Context, j sdk.Job) error {
		select {
		case stuck <- j:
		default:
		}
		<-ctx.Done() // never acks
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	holder(t, "mailer", first)
	log := newJobLog()
	second := b.client(mailerSeed)
	if err := second.Accept("send", log.handler(second.Instance())); err != nil {
		t.Fatal(err)
	}
	ids := submit(t, b.client(shopSeed), "mailer", "send", 10)
	var j sdk.Job
	select {
	case j = <-stuck:
	case <-time.After(10 * time.Second):
		t.Fatal("the first holder never got a job")
	}
	_, epoch1 := first.Holding("mailer")

	// The holder's connection drops, without a release and without an ack.
	start := time.Now()
	first.Conn().Close()
	retryUntil(t, 20*time.Second, func() error {
		if n := log.distinct(); n != len(ids) {
			return fmt.Errorf("%d of %d jobs handled by the new holder", n, len(ids))
		}
		return nil
	})
	t.Logf("all jobs handled by the new holder %s after the old one dropped", time.Since(start))
	log.mu.Lock()
	if log.count[j.ID] != 1 {
		t.Errorf("the job in hand (%s) was handled %d times by the new holder, want 1", j.ID, log.count[j.ID])
	}
	log.mu.Unlock()
	if ok, epoch2 := second.Holding("mailer"); !ok || epoch2 <= epoch1 {
		t.Errorf("new holder epoch %d, old %d: want a larger fencing token", epoch2, epoch1)
	}
	// Fencing: a connection of the old instance is refused the ack and the seat's events.
	stale := connect(t, b.n.ClientURL(), mailerSeed, nats.Name(first.Instance()), nats.CustomInboxPrefix("_INBOX.mailer"))
	defer stale.Close()
	for _, s := range []string{"$JS.ACK.SEAT_mailer.seat-mailer.1.1.1.1.1", "mesh.seat.mailer.event.delivered"} {
		if !refusedPub(t, stale, s) {
			t.Errorf("the stale holder published on %s", s)
		}
	}
}

// TestSeat_GracefulHandoff: a holder that closes releases the seat at once; the next instance
// holds it and the work flows.
func TestSeat_GracefulHandoff(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mailerSeed, _ := b.register(mailerManifest)
	shopSeed, _ := b.register(shopManifest)
	log := newJobLog()
	c1 := b.client(mailerSeed)
	if err := c1.Accept("send", log.handler("c1")); err != nil {
		t.Fatal(err)
	}
	holder(t, "mailer", c1)
	c2 := b.client(mailerSeed)
	if err := c2.Accept("send", log.handler("c2")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c1.Close()
	holder(t, "mailer", c2)
	t.Logf("handoff took %s", time.Since(start))
	ids := submit(t, b.client(shopSeed), "mailer", "send", 5)
	retryUntil(t, 10*time.Second, func() error {
		if n := log.distinct(); n != len(ids) {
			return fmt.Errorf("%d of %d handled", n, len(ids))
		}
		return nil
	})
	// The seat's own events record the change of holder.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, manifest.EventsStreamName)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"seat.held", "seat.released"} {
		if _, err := s.GetLastMsgForSubject(ctx, manifest.NodeEventSubject("alpha", name)); err != nil {
			t.Errorf("no %s event: %v", name, err)
		}
	}
}

// TestSeat_NodeScoped: a node-scoped seat has a queue per node; this node's holder consumes
// only its own node's queue.
func TestSeat_NodeScoped(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	seed, _ := b.register("module: agent\nrequires: [mesh-bus]\nseats:\n  agent: {scope: node, retain: 1h, accepts: [run]}\n")
	userSeed, _ := b.register("module: ops\nrequires: [mesh-bus]\nuses: [agent]\n")
	log := newJobLog()
	c := b.client(seed)
	if err := c.Accept("run", log.handler("local")); err != nil {
		t.Fatal(err)
	}
	holder(t, "agent", c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A job for another node's holder waits in the same stream, for that node.
	if _, err := b.js.Publish(ctx, manifest.SeatNodeAcceptSubject("agent", "beta", "run"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	ids := submit(t, b.client(userSeed), "agent", "run", 3)
	retryUntil(t, 10*time.Second, func() error {
		if n := log.distinct(); n != len(ids) {
			return fmt.Errorf("%d of %d handled", n, len(ids))
		}
		return nil
	})
	cons, err := b.js.Consumer(ctx, "SEAT_agent", "seat-agent-alpha")
	if err != nil {
		t.Fatalf("node consumer: %v", err)
	}
	if f := cons.CachedInfo().Config.FilterSubject; f != "mesh.seat.agent.node.alpha.accept.>" {
		t.Errorf("node consumer filter %q", f)
	}
	// The handler has run; its ack follows: the queue keeps beta's job alone once it lands.
	retryUntil(t, 10*time.Second, func() error {
		s, err := b.js.Stream(ctx, "SEAT_agent")
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 1 {
			return fmt.Errorf("SEAT_agent holds %d jobs, want beta's 1", info.State.Msgs)
		}
		return nil
	})
	if log.distinct() != 3 {
		t.Errorf("alpha's holder handled %d jobs, want its own 3", log.distinct())
	}
}

// TestSeat_Retention: a seat's queue keeps a job for the retain the seat declares, and no
// longer: slow's (retain: 1s) are gone; keep's (retain: 1h) are still queued once older than
// 3 s — a queue that kept every job 3 s, whatever its seat declared, passed a bed that only
// waited for jobs to go.
func TestSeat_Retention(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	b.register("module: slow\nrequires: [mesh-bus]\nseats:\n  slow: {scope: mesh, retain: 1s, accepts: [work]}\n")
	b.register("module: keep\nrequires: [mesh-bus]\nseats:\n  keep: {scope: mesh, retain: 1h, accepts: [work]}\n")
	seed, _ := b.register("module: boss\nrequires: [mesh-bus]\nuses: [slow, keep]\n")
	boss := b.client(seed)
	queued := time.Now()
	submit(t, boss, "keep", "work", 3)
	submit(t, boss, "slow", "work", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	queue := func(name string, retain time.Duration) jetstream.Stream {
		s, err := b.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.MaxAge; got != retain {
			t.Fatalf("%s MaxAge=%s, want the declared %s", name, got, retain)
		}
		return s
	}
	slow, keep := queue("SEAT_slow", time.Second), queue("SEAT_keep", time.Hour)
	retryUntil(t, 5*time.Second, func() error {
		info, err := slow.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 0 {
			return fmt.Errorf("%d jobs still queued", info.State.Msgs)
		}
		return nil
	})
	// Polled until the oldest of keep's jobs is older than 3 s (with a margin), never gone.
	retryUntil(t, 20*time.Second, func() error {
		info, err := keep.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 3 {
			t.Fatalf("SEAT_keep holds %d of its 3 jobs, queued %s ago; want them kept for the declared 1h", info.State.Msgs, time.Since(queued).Round(time.Millisecond))
		}
		if age := time.Since(info.State.FirstTime); age < 4*time.Second {
			return fmt.Errorf("SEAT_keep's oldest job is %s old, want past 4s", age)
		}
		return nil
	})
}
