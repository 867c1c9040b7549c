package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
