package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/testbed"
)

// TestOutputLog_RotatesWhileWritten: a log past its bound is rotated at the write that would
// pass it — not only when a process starts — keeping one old file; nothing written is lost
// but what is older than that.
func TestOutputLog_RotatesWhileWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "output.log")
	l, err := openOutputLog(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"a", "b", "c", "d"} {
		if _, err := l.Write([]byte(strings.Repeat(line, 39) + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// 40 bytes a line: a and b fill 80, c would pass 100 and starts a new file with d.
	if got, want := read(path+".1"), strings.Repeat("a", 39)+"\n"+strings.Repeat("b", 39)+"\n"; got != want {
		t.Fatalf("output.log.1 = %q, want %q", got, want)
	}
	if got, want := read(path), strings.Repeat("c", 39)+"\n"+strings.Repeat("d", 39)+"\n"; got != want {
		t.Fatalf("output.log = %q, want %q", got, want)
	}
	// Opened again past its bound (a node restarting): rotated first.
	if err := os.WriteFile(path, []byte(strings.Repeat("e", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err = openOutputLog(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("f\n"))
	l.Close()
	if got := read(path); got != "f\n" {
		t.Fatalf("output.log after a reopen past its bound = %q", got)
	}
}

// TestOutputLog_NeverFails: a write the disk refuses is dropped, not returned: an error would
// end the copy from the processes' pipe and kill them with SIGPIPE at their next write.
func TestOutputLog_NeverFails(t *testing.T) {
	l := &outputLog{path: "/dev/full", max: 1 << 20}
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		testbed.Skip(t, "no /dev/full: %v", err)
	}
	l.f = f
	defer l.Close()
	if n, err := l.Write([]byte("lost\n")); n != 5 || err != nil {
		t.Fatalf("Write to a full disk = %d, %v; want 5, nil", n, err)
	}
}

// TestOutputLog_DeletedByHand: a log an operator deleted is started again at the next
// rotation, instead of growing unlinked for ever.
func TestOutputLog_DeletedByHand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "output.log")
	l, err := openOutputLog(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Write([]byte(strings.Repeat("a", 60)))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	l.Write([]byte(strings.Repeat("b", 60)))
	b, err := os.ReadFile(path)
	if err != nil || string(b) != strings.Repeat("b", 60) {
		t.Fatalf("output.log after it was deleted: %q, %v", b, err)
	}
}
