package sandbox_test

import (
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/sandbox"
)

// TestNodeUIDs: two nodes on one machine draw ranges of their own, above systemd's and below
// 2^31, and one node always the same.
func TestNodeUIDs(t *testing.T) {
	a1, a2 := sandbox.NodeUIDs("/var/lib/meshnode")
	b1, b2 := sandbox.NodeUIDs("/srv/second-node")
	if again, _ := sandbox.NodeUIDs("/var/lib/meshnode"); again != a1 {
		t.Fatalf("one data dir drew %d, then %d", a1, again)
	}
	for _, r := range [][2]int{{a1, a2}, {b1, b2}} {
		if r[0] < 0x70000000 || r[1] >= 0x7FFE0000 || r[1]-r[0] != 1023 {
			t.Fatalf("range %d-%d, want 1,024 uids in 0x70000000-0x7FFDFFFF", r[0], r[1])
		}
	}
	if a1 == b1 {
		t.Fatalf("two data dirs drew the same range %d-%d", a1, a2)
	}
}

// TestUsers_KeepsAndReleases: a module keeps its uid across a reopen of the record; another
// module gets another; a released uid is free again.
func TestUsers_KeepsAndReleases(t *testing.T) {
	path := filepath.Join(t.TempDir(), "users.json")
	first, last := sandbox.NodeUIDs(path)
	u, err := sandbox.OpenUsers(path, first, last)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := u.For("a")
	b, _ := u.For("b")
	if a == nil || b == nil || a.UID == b.UID || a.UID != a.GID {
		t.Fatalf("a %+v, b %+v: want two users of their own", a, b)
	}
	again, err := sandbox.OpenUsers(path, first, last)
	if err != nil {
		t.Fatal(err)
	}
	if a2, _ := again.For("a"); a2.UID != a.UID {
		t.Fatalf("a is uid %d after a reopen, was %d", a2.UID, a.UID)
	}
	again.Release("a")
	if c, _ := again.For("c"); c.UID != a.UID {
		t.Fatalf("c got uid %d, want a's released %d", c.UID, a.UID)
	}
	if _, err := sandbox.OpenUsers(path, 10, 5); err == nil {
		t.Fatal("a range whose last is below its first was taken")
	}
}
