package membership_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/membership"
	"go.uber.org/goleak"
)

// memberlist's Shutdown does not wait for a probe in flight: its goroutine waits out the probe
// timeout on its own (about half a second) and then ends. Everything else must be gone.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

func key(t *testing.T) []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}

func open(t *testing.T, name, mesh string, k []byte) *membership.Membership {
	t.Helper()
	m, err := membership.Open(membership.Config{
		Meta:      membership.Meta{Name: name, MeshID: mesh, Client: "nats://127.0.0.1:4222", Version: "v-" + name},
		BindAddr:  "127.0.0.1:0",
		GossipKey: k,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

var retryUntil = testbed.RetryUntil

func TestMembership_Form(t *testing.T) {
	k := key(t)
	a, b, c := open(t, "a", "mesh1", k), open(t, "b", "mesh1", k), open(t, "c", "mesh1", k)
	if err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	if err := c.Join([]string{b.Addr()}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*membership.Membership{a, b, c} {
		retryUntil(t, 10*time.Second, func() error {
			ms := m.Members()
			if len(ms) != 3 {
				return fmt.Errorf("%d members", len(ms))
			}
			for _, x := range ms {
				// Each member's version travels in its meta: status shows a mixed mesh.
				if x.MeshID != "mesh1" || x.State != "alive" || x.Client == "" || x.Version != "v-"+x.Name {
					return fmt.Errorf("member %+v", x)
				}
				if x.Name == "a" && x.Addr != a.Addr() {
					return fmt.Errorf("a is seen at %s, it gossips at %s", x.Addr, a.Addr())
				}
			}
			return nil
		})
	}
	// A goodbye says why; a node that just vanishes is dead.
	if err := c.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 20*time.Second, func() error {
		states := map[string]string{}
		for _, x := range a.Members() {
			states[x.Name] = x.State
		}
		if states["a"] != "alive" || states["b"] != "dead" || states["c"] != "left" {
			return fmt.Errorf("a sees %v", states)
		}
		return nil
	})
}

func TestMembership_Stop(t *testing.T) {
	k := key(t)
	a, b := open(t, "a", "mesh1", k), open(t, "b", "mesh1", k)
	if err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(time.Second); err != nil {
		t.Fatal(err)
	}
	retryUntil(t, 10*time.Second, func() error {
		for _, x := range a.Members() {
			if x.Name == "b" && x.State == "stopped" {
				return nil
			}
		}
		return fmt.Errorf("a sees %+v", a.Members())
	})
}

func TestMembership_RefusesAnotherMesh(t *testing.T) {
	k := key(t)
	a := open(t, "a", "mesh1", k)
	x := open(t, "x", "mesh2", k)
	err := x.Join([]string{a.Addr()})
	if !errors.Is(err, membership.ErrForeign) || !strings.Contains(err.Error(), "mesh1") || !strings.Contains(err.Error(), "mesh2") {
		t.Fatalf("join across meshes: %v", err)
	}
	for _, m := range a.Members() {
		if m.Name == "x" && m.State == "alive" {
			t.Fatal("the foreign node is a member")
		}
	}
}

func TestMembership_RefusesAWrongKey(t *testing.T) {
	a := open(t, "a", "mesh1", key(t))
	x := open(t, "x", "mesh1", key(t))
	err := x.Join([]string{a.Addr()})
	if !errors.Is(err, membership.ErrGossipKey) || !strings.Contains(err.Error(), "another mesh, or this node's key is wrong") {
		t.Fatalf("join with the wrong key: %v", err)
	}
	// Nothing listening is not a wrong key: the node there may not have started yet.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	free := l.Addr().String()
	l.Close()
	if err := x.Join([]string{free}); err == nil || errors.Is(err, membership.ErrGossipKey) {
		t.Fatalf("join where nothing listens: %v", err)
	}
	if n := len(a.Members()); n != 1 {
		t.Fatalf("a has %d members after a wrong-key join", n)
	}
}

// TestMembership_FoundingTokenSpent: once the mesh has formed, a node that comes with the
// founding token is refused, by both sides; its founding members are not.
func TestMembership_FoundingTokenSpent(t *testing.T) {
	k := key(t)
	a := open(t, "a", "mesh1", k)
	b := open(t, "b", "mesh1", k)
	if err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*membership.Membership{a, b} {
		m.MarkFormed([]string{"a", "b"})
	}
	late := open(t, "late", "mesh1", k)
	err := late.Join([]string{a.Addr()})
	if !errors.Is(err, membership.ErrFoundingSpent) || !strings.Contains(err.Error(), "token create") {
		t.Fatalf("a founding node joining a formed mesh: %v", err)
	}
	retryUntil(t, 5*time.Second, func() error {
		for _, m := range a.Members() {
			if m.Name == "b" && m.State != "alive" {
				return fmt.Errorf("founding member b is %s", m.State)
			}
		}
		return nil
	})
	for _, m := range a.Members() {
		if m.Name == "late" && m.State == "alive" {
			t.Fatal("the formed mesh took in a node with the spent founding token")
		}
	}
}

// TestMembership_BoundClient: a node whose client port was left to the system advertises the
// port its bus bound, and the others see it; a fixed port is not replaced.
func TestMembership_BoundClient(t *testing.T) {
	k := key(t)
	a, err := membership.Open(membership.Config{
		Meta:     membership.Meta{Name: "a", MeshID: "mesh1", Client: "nats://127.0.0.1:0"},
		BindAddr: "127.0.0.1:0", GossipKey: k,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b := open(t, "b", "mesh1", k)
	if err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	a.BoundClient("tls://127.0.0.1:4567") // with TLS on the client port
	b.BoundClient("nats://127.0.0.1:9999")
	want := map[string]string{"a": "nats://127.0.0.1:4567", "b": "nats://127.0.0.1:4222"}
	for _, m := range []*membership.Membership{a, b} {
		retryUntil(t, 10*time.Second, func() error {
			for _, x := range m.Members() {
				if x.Client != want[x.Name] {
					return fmt.Errorf("member %s's client is %q, want %q", x.Name, x.Client, want[x.Name])
				}
			}
			return nil
		})
	}
}

// TestMembership_LeftWithoutItsGoodbye: a member that announced it leaves (its stored `left`
// event: Left) and then ends without its goodbye reaching the others shows as left, not dead,
// whether the announcement comes before its end is seen or after.
func TestMembership_LeftWithoutItsGoodbye(t *testing.T) {
	k := key(t)
	a, b, c := open(t, "a", "mesh1", k), open(t, "b", "mesh1", k), open(t, "c", "mesh1", k)
	for _, n := range []*membership.Membership{b, c} {
		if err := n.Join([]string{a.Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	state := func(name string) string {
		for _, x := range a.Members() {
			if x.Name == name {
				return x.State
			}
		}
		return ""
	}
	a.Left("b") // announced first
	b.Close()   // then gone without a goodbye
	retryUntil(t, 30*time.Second, func() error {
		if s := state("b"); s != "left" {
			return fmt.Errorf("a sees b %q, want left", s)
		}
		return nil
	})
	c.Close() // gone first, without a goodbye
	retryUntil(t, 30*time.Second, func() error {
		if s := state("c"); s != "dead" {
			return fmt.Errorf("a sees c %q, want dead before its announcement", s)
		}
		return nil
	})
	a.Left("c")
	if s := state("c"); s != "left" {
		t.Errorf("a sees c %q after its announcement, want left", s)
	}
}
