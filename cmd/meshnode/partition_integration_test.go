//go:build integration

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
)

// netbed is three network namespaces on one bridge: a machine each, on one LAN. The test
// process reaches every namespace through the bridge's address in the root namespace.
type netbed struct {
	prefix string   // 10.x.0
	ns     []string // namespace of machine i
	veth   []string // its link on the bridge, in the root namespace
	bridge string
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newNetbed makes the namespaces, or skips the test where this machine cannot (it needs
// root and the ip tool; CI has both).
func newNetbed(t *testing.T, machines int) *netbed {
	t.Helper()
	tag := strconv.Itoa(1000 + rand.IntN(9000))
	if out, err := exec.Command("ip", "netns", "add", "mnprobe"+tag).CombinedOutput(); err != nil {
		testbed.Skip(t, "network namespaces are not available here (needs root and iproute2): %v %s", err, out)
	}
	exec.Command("ip", "netns", "del", "mnprobe"+tag).Run()
	b := &netbed{prefix: fmt.Sprintf("10.%d.%d", 100+rand.IntN(100), rand.IntN(250)), bridge: "mnbr" + tag}
	t.Cleanup(func() {
		for _, ns := range b.ns {
			exec.Command("ip", "netns", "del", ns).Run()
		}
		exec.Command("ip", "link", "del", b.bridge).Run()
	})
	ip(t, "link", "add", b.bridge, "type", "bridge")
	ip(t, "addr", "add", b.prefix+".254/24", "dev", b.bridge)
	ip(t, "link", "set", b.bridge, "up")
	for i := 1; i <= machines; i++ {
		ns, veth, peer := fmt.Sprintf("mn%s-%d", tag, i), fmt.Sprintf("mnv%s%d", tag, i), fmt.Sprintf("mnp%s%d", tag, i)
		b.ns, b.veth = append(b.ns, ns), append(b.veth, veth)
		ip(t, "netns", "add", ns)
		ip(t, "link", "add", veth, "type", "veth", "peer", "name", peer)
		ip(t, "link", "set", peer, "netns", ns)
		ip(t, "-n", ns, "addr", "add", fmt.Sprintf("%s.%d/24", b.prefix, i), "dev", peer)
		ip(t, "-n", ns, "link", "set", peer, "up")
		ip(t, "-n", ns, "link", "set", "lo", "up")
		ip(t, "link", "set", veth, "master", b.bridge)
		ip(t, "link", "set", veth, "up")
	}
	return b
}

func (b *netbed) addr(i int) string { return fmt.Sprintf("%s.%d", b.prefix, i+1) }

// cut takes machine i off the LAN; heal puts it back.
func (b *netbed) cut(t *testing.T, i int)  { ip(t, "link", "set", b.veth[i], "down") }
func (b *netbed) heal(t *testing.T, i int) { ip(t, "link", "set", b.veth[i], "up") }

// command runs a program in machine i's namespace.
func (b *netbed) command(i int, name string, args ...string) *exec.Cmd {
	cmd := exec.Command("ip", append([]string{"netns", "exec", b.ns[i], name}, args...)...)
	cmd.Env = cleanEnv()
	return cmd
}

// seatLog is what a worker process printed: when it held the seat (with the epoch) and
// when it stopped.
type seatLog struct {
	mu    sync.Mutex
	spans []span
}

type span struct {
	who        string
	epoch      uint64
	from, till time.Time // till is zero while held
}

// follow reads a worker's output; ready is closed when the worker says so.
func (l *seatLog) follow(who string, sc *bufio.Scanner, ready chan<- struct{}) {
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		l.mu.Lock()
		switch {
		case len(f) == 1 && f[0] == "ready":
			close(ready)
		case len(f) == 3 && f[0] == "held":
			epoch, _ := strconv.ParseUint(f[1], 10, 64)
			ns, _ := strconv.ParseInt(f[2], 10, 64)
			l.spans = append(l.spans, span{who: who, epoch: epoch, from: time.Unix(0, ns)})
		case len(f) == 2 && f[0] == "free":
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			for i := range l.spans {
				if l.spans[i].who == who && l.spans[i].till.IsZero() {
					l.spans[i].till = time.Unix(0, ns)
				}
			}
		}
		l.mu.Unlock()
	}
}

func (l *seatLog) holding(who string) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.spans {
		if s.who == who && s.till.IsZero() {
			return s.epoch, true
		}
	}
	return 0, false
}

// overlaps returns a description of two holders at once, or "".
func (l *seatLog) overlaps() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	spans := slices.Clone(l.spans)
	slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
	for i := 1; i < len(spans); i++ {
		prev, next := spans[i-1], spans[i]
		if prev.till.IsZero() || prev.till.After(next.from) {
			return fmt.Sprintf("%s held epoch %d from %s until %v, %s took epoch %d at %s",
				prev.who, prev.epoch, prev.from.Format(time.StampMicro), prev.till, next.who, next.epoch, next.from.Format(time.StampMicro))
		}
		if next.epoch <= prev.epoch {
			return fmt.Sprintf("epoch went from %d (%s) to %d (%s)", prev.epoch, prev.who, next.epoch, next.who)
		}
	}
	return ""
}

// emitLog is what an emitter process printed: its acknowledged writes and its failures.
type emitLog struct {
	mu     sync.Mutex
	acked  []ack
	failed []time.Time
}

type ack struct {
	id string
	at time.Time
}

func (e *emitLog) follow(sc *bufio.Scanner) {
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		e.mu.Lock()
		switch {
		case len(f) == 3 && f[0] == "acked":
			ns, _ := strconv.ParseInt(f[2], 10, 64)
			e.acked = append(e.acked, ack{f[1], time.Unix(0, ns)})
		case len(f) == 2 && f[0] == "failed":
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			e.failed = append(e.failed, time.Unix(0, ns))
		}
		e.mu.Unlock()
	}
}

func (e *emitLog) ackedBetween(from, to time.Time) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, a := range e.acked {
		if a.at.After(from) && a.at.Before(to) {
			n++
		}
	}
	return n
}

func (e *emitLog) failedBetween(from, to time.Time) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, at := range e.failed {
		if at.After(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// ids returns the events acknowledged before t.
func (e *emitLog) ids(t time.Time) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, a := range e.acked {
		if a.at.Before(t) {
			out = append(out, a.id)
		}
	}
	return out
}

// TestIntegration_MinorityPartition: three machines (network namespaces) form a mesh; the one
// whose worker holds a mesh-scoped seat is cut off the LAN, while an emitter on each side
// writes every 50 ms. The cut side acknowledges nothing; the majority goes on writing, and
// the seat moves there — never two holders at once, epochs only growing. Healed, the cut
// machine rejoins, and every acknowledged write is in every audit log.
func TestIntegration_MinorityPartition(t *testing.T) {
	b := newNetbed(t, 3)
	nodes := make([]*meshNode, 3)
	for i, name := range []string{"a", "b", "c"} {
		dir := t.TempDir()
		nodes[i] = &meshNode{dir: dir, name: name, flags: []string{"--data-dir", dir, "--name", name,
			"--client-addr", b.addr(i) + ":4222", "--http-addr", b.addr(i) + ":8222",
			"--cluster-addr", b.addr(i) + ":6222", "--gossip-addr", b.addr(i) + ":7946", "--log-level", "info"}}
	}
	a, c := nodes[0], nodes[2]
	r := meshnode(t, nil, append([]string{"genesis", "--expect", "3", "--json"}, a.flags...)...)
	if r.code != 0 {
		t.Fatalf("genesis: %s", r.stderr)
	}
	var g struct {
		Token string `json:"founding_token"`
	}
	json.Unmarshal([]byte(r.stdout), &g)
	token := g.Token
	for i, n := range nodes {
		args := append([]string{"run"}, n.flags...)
		if i > 0 {
			args = append([]string{"join", "--token", token}, n.flags...)
		}
		n.p = launchCmd(t, b.command(i, binary, args...), args[0])
	}
	for _, n := range nodes {
		n.p.awaitReady(t, 90*time.Second)
	}
	op := filepath.Join(a.dir, "operator.nk")
	workerSeed := registerModule(t, a.dir, "module: worker\nrequires: [mesh-bus]\nseats:\n  jobs: {scope: mesh, retain: 1h, accepts: [run]}\n")
	tickerSeed := registerModule(t, a.dir, "module: ticker\nrequires: [mesh-bus]\nemits: [tick]\n")

	// Workers are this test binary run as a module, one on c (it takes the seat first) and
	// one on a, each in its machine's namespace.
	log := &seatLog{}
	// helper runs this test binary in machine i's namespace as role (WORKER or EMITTER),
	// connected to that machine's node with seed, and returns its output.
	helper := func(i int, role, seed string) *bufio.Scanner {
		self, _ := os.Executable()
		cmd := b.command(i, self)
		// The client port is off loopback, so TLS: the module trusts its node's ca.pem, as a
		// module the node runs does (MESH_CA).
		cmd.Env = append(cleanEnv(), "MESHNODE_TEST_"+role+"=nats://"+b.addr(i)+":4222", "MESHNODE_TEST_"+role+"_SEED="+seed,
			"MESH_CA="+filepath.Join(nodes[i].dir, "ca.pem"))
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return bufio.NewScanner(out)
	}
	worker := func(i int, who string) {
		ready := make(chan struct{})
		go log.follow(who, helper(i, "WORKER", workerSeed), ready)
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			t.Fatalf("worker on %s not ready", who)
		}
	}
	emitter := func(i int) *emitLog {
		e := &emitLog{}
		go e.follow(helper(i, "EMITTER", tickerSeed))
		return e
	}
	worker(2, "c")
	retryUntil(t, 20*time.Second, func() error {
		if _, ok := log.holding("c"); !ok {
			return fmt.Errorf("the worker on c does not hold the seat: %+v", log.spans)
		}
		return nil
	})
	epochC, _ := log.holding("c")
	worker(0, "a")

	majority, minority := emitter(0), emitter(2)
	retryUntil(t, 20*time.Second, func() error {
		if len(minority.ids(time.Now())) == 0 || len(majority.ids(time.Now())) == 0 {
			return errors.New("the emitters have no write acknowledged yet")
		}
		return nil
	})

	// Cut c off.
	b.cut(t, 2)
	cut := time.Now()
	retryUntil(t, 60*time.Second, func() error {
		if epoch, ok := log.holding("a"); !ok || epoch <= epochC {
			return fmt.Errorf("the seat has not moved to a: %+v\nnode a's log:\n%s", log.spans, grepLines(a.p.stderr.String(), "seat", "lease", "leader"))
		}
		return nil
	})
	t.Logf("the seat moved to the majority %s after the cut", time.Since(cut))
	if _, ok := log.holding("c"); ok {
		t.Fatal("the worker on the cut machine still holds the seat")
	}

	// Hold the cut until both emitters have worked on their side of it for a while.
	retryUntil(t, 30*time.Second, func() error {
		if n, f := majority.ackedBetween(cut, time.Now()), minority.failedBetween(cut.Add(3*time.Second), time.Now()); n < 10 || f < 3 {
			return fmt.Errorf("while cut off: majority acked %d, minority refused %d", n, f)
		}
		return nil
	})
	b.heal(t, 2)
	healed := time.Now()

	// The minority accepted nothing while cut off (a write in flight at the cut may still be
	// answered); the majority went on taking writes.
	if n := minority.ackedBetween(cut.Add(3*time.Second), healed); n > 0 {
		t.Fatalf("the cut machine acknowledged %d writes while cut off", n)
	}
	if minority.failedBetween(cut.Add(3*time.Second), healed) == 0 {
		t.Fatal("the minority's emitter saw no refusal while cut off")
	}
	if n := majority.ackedBetween(cut, healed); n == 0 {
		t.Fatal("the majority acknowledged no write while c was cut off")
	}
	t.Logf("while cut off: majority acked %d writes, minority acked %d and refused %d",
		majority.ackedBetween(cut, healed), minority.ackedBetween(cut, healed), minority.failedBetween(cut, healed))

	// Healed, c rejoins; every acknowledged write of either side is in every audit log.
	for _, n := range []*meshNode{a, c} {
		retryUntil(t, 60*time.Second, func() error {
			ids, err := queryAuditIDs(t, n.dir, op, "ticker")
			if err != nil {
				return err
			}
			for _, e := range []*emitLog{majority, minority} {
				for _, id := range e.ids(healed) {
					if ids[id] != 1 {
						return fmt.Errorf("%s's audit log lacks acknowledged event %s (%d events)", n.name, id, len(ids))
					}
				}
			}
			return nil
		})
	}
	if o := log.overlaps(); o != "" {
		t.Fatalf("two holders at once: %s", o)
	}
}

// grepLines returns the lines of text that contain any of words.
func grepLines(text string, words ...string) string {
	var out []string
	for line := range strings.Lines(text) {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, strings.TrimSpace(line))
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
