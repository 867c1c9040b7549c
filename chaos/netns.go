package chaos

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// lan is one network namespace per machine on one bridge: a LAN the test makes and removes.
// The test process, in the root namespace, reaches every machine through the bridge's
// address; the machines' links and routes are what the partitions cut.
type lan struct {
	tag    string
	prefix string   // 10.x.y
	bridge string   // in the root namespace
	ns     []string // machine i's namespace
	veth   []string // machine i's link on the bridge, in the root namespace

	mu      sync.Mutex
	blocked map[[2]int]bool // a prohibit route in the namespace of [0] to the address of [1]
}

// newLAN makes the bridge, or skips t where this machine cannot (it needs root and
// iproute2; CI has both). Its namespaces and the bridge are removed when t ends.
func newLAN(t testing.TB) *lan {
	t.Helper()
	tag := strconv.Itoa(1000 + rand.IntN(9000))
	if out, err := exec.Command("ip", "netns", "add", "mncprobe"+tag).CombinedOutput(); err != nil {
		testbed.Skip(t, "network namespaces are not available here (needs root and iproute2): %v %s", err, out)
	}
	exec.Command("ip", "netns", "del", "mncprobe"+tag).Run()
	l := &lan{tag: tag, prefix: fmt.Sprintf("10.%d.%d", 100+rand.IntN(100), rand.IntN(250)), bridge: "mncbr" + tag,
		blocked: map[[2]int]bool{}}
	t.Cleanup(func() {
		for _, ns := range l.ns {
			exec.Command("ip", "netns", "del", ns).Run()
		}
		exec.Command("ip", "link", "del", l.bridge).Run()
	})
	mustIP(t, "link", "add", l.bridge, "type", "bridge")
	mustIP(t, "addr", "add", l.prefix+".254/24", "dev", l.bridge)
	mustIP(t, "link", "set", l.bridge, "up")
	return l
}

// add makes the next machine's namespace and link, and returns its index.
func (l *lan) add(t testing.TB) int {
	t.Helper()
	i := len(l.ns)
	ns, veth, peer := fmt.Sprintf("mnc%s-%d", l.tag, i), fmt.Sprintf("mncv%s-%d", l.tag, i), fmt.Sprintf("mncp%s-%d", l.tag, i)
	l.ns, l.veth = append(l.ns, ns), append(l.veth, veth)
	mustIP(t, "netns", "add", ns)
	mustIP(t, "link", "add", veth, "type", "veth", "peer", "name", peer)
	mustIP(t, "link", "set", peer, "netns", ns)
	mustIP(t, "-n", ns, "addr", "add", fmt.Sprintf("%s/24", l.addr(i)), "dev", peer)
	mustIP(t, "-n", ns, "link", "set", peer, "up")
	mustIP(t, "-n", ns, "link", "set", "lo", "up")
	mustIP(t, "link", "set", veth, "master", l.bridge)
	mustIP(t, "link", "set", veth, "up")
	return i
}

// addr is machine i's address on the bridge.
func (l *lan) addr(i int) string { return fmt.Sprintf("%s.%d", l.prefix, i+1) }

// command runs name in machine i's namespace (`ip netns exec` execs it: the process is the
// program itself, so a signal to it reaches the program).
func (l *lan) command(i int, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", l.ns[i], name}, args...)...)
}

// block makes every machine of a unreachable from every machine of b and back, by a
// prohibit route to each peer's address inside each namespace: a per-pair cut, so a third
// machine may still see both (there is no nftables or iptables to count on).
func (l *lan) block(a, b []int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			for _, p := range [][2]int{{x, y}, {y, x}} {
				if p[0] == p[1] || l.blocked[p] {
					continue
				}
				if err := runIP("-n", l.ns[p[0]], "route", "add", "prohibit", l.addr(p[1])+"/32"); err != nil {
					return err
				}
				l.blocked[p] = true
			}
		}
	}
	return nil
}

// cut takes machine i's link off the bridge: nothing reaches it, the test process included.
func (l *lan) cut(i int) error { return runIP("link", "set", l.veth[i], "down") }

// heal removes every prohibit route and puts every link back up.
func (l *lan) heal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []string
	for p := range l.blocked {
		if err := runIP("-n", l.ns[p[0]], "route", "del", "prohibit", l.addr(p[1])+"/32"); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		delete(l.blocked, p)
	}
	for _, veth := range l.veth {
		if err := runIP("link", "set", veth, "up"); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("heal the network: %s", strings.Join(errs, "; "))
	}
	return nil
}

func runIP(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func mustIP(t testing.TB, args ...string) {
	t.Helper()
	if err := runIP(args...); err != nil {
		t.Fatal(err)
	}
}
