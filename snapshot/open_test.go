package snapshot_test

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/snapshot"
)

// mustSaveBytes saves a mesh like mustMesh's and returns the file's bytes.
func mustSaveBytes(t *testing.T) []byte {
	t.Helper()
	path, _ := mustSave(t, mustMesh(t))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// opener opens bytes as a snapshot, through one file of t's.
type opener struct {
	t    *testing.T
	path string
}

func newOpener(t *testing.T) *opener { return &opener{t, filepath.Join(t.TempDir(), "x.snap")} }

// open writes b to the file and opens it as a snapshot.
func (o *opener) open(b []byte) error {
	t, path := o.t, o.path
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := snapshot.Open(path)
	if err == nil {
		r.Close()
	}
	return err
}

// dataRegions returns where each entry's data lies in the archive b: [start, end).
func dataRegions(t *testing.T, b []byte) map[string][2]int {
	t.Helper()
	rd := bytes.NewReader(b)
	tr := tar.NewReader(rd)
	regions := map[string][2]int{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return regions
		}
		if err != nil {
			t.Fatal(err)
		}
		start := len(b) - rd.Len()
		regions[hdr.Name] = [2]int{start, start + int(hdr.Size)}
	}
}

// positions are where the tests change or cut the archive b: every 31st byte (every byte
// took 20 s), and every byte of each entry's header's checksum, each block's boundary and
// each entry's first and last byte.
func positions(b []byte, regions map[string][2]int) []int {
	var at []int
	for i := 0; i < len(b); i += 31 {
		at = append(at, i)
	}
	for _, r := range regions {
		for i := r[0] - 512 + 148; i < r[0]-512+156; i++ {
			at = append(at, i)
		}
		at = append(at, r[0], r[1]-1, r[1])
	}
	for i := 512; i < len(b); i += 512 {
		at = append(at, i-1, i)
	}
	return slices.DeleteFunc(at, func(i int) bool { return i >= len(b) })
}

// TestOpen_FlippedByte: a file with any one byte changed is refused — in an entry's data
// (named), in a tar header, in the padding between entries or in the archive's end.
func TestOpen_FlippedByte(t *testing.T) {
	good := mustSaveBytes(t)
	o := newOpener(t)
	if err := o.open(good); err != nil {
		t.Fatal(err)
	}
	regions := dataRegions(t, good)
	if len(regions) != 7 {
		t.Fatalf("the archive's entries: %v, want the manifest, 5 streams and SHA256SUMS", regions)
	}
	for _, at := range positions(good, regions) {
		bad := bytes.Clone(good)
		bad[at] ^= 0xff
		err := o.open(bad)
		if err == nil {
			t.Fatalf("a file with byte %d of %d changed opened", at, len(good))
		}
		for name, r := range regions {
			if r[0] <= at && at < r[1] && !strings.Contains(err.Error(), "entry "+name+"'s") {
				t.Fatalf("byte %d changed, in entry %s: %v; want the entry named", at, name, err)
			}
		}
	}
}

// TestOpen_Truncated: a file cut short anywhere is refused as truncated (or, cut within its
// first header, as no snapshot at all).
func TestOpen_Truncated(t *testing.T) {
	good := mustSaveBytes(t)
	o := newOpener(t)
	for _, n := range positions(good, dataRegions(t, good)) {
		err := o.open(good[:n])
		switch {
		case err == nil:
			t.Fatalf("the first %d of %d bytes opened", n, len(good))
		case n < 512 && strings.Contains(err.Error(), "is not a meshnode snapshot"):
		case !strings.Contains(err.Error(), "is a truncated meshnode snapshot") || !strings.Contains(err.Error(), "save again"):
			t.Fatalf("the first %d of %d bytes: %v; want it called truncated, and what to do", n, len(good), err)
		}
	}
}

// TestOpen_Foreign: what is no meshnode snapshot is refused as such, saying what to name.
func TestOpen_Foreign(t *testing.T) {
	random := make([]byte, 4096)
	rand.Read(random)
	archive := func(entries ...string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, name := range entries {
			tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: 2, Typeflag: tar.TypeReg})
			tw.Write([]byte("{}"))
		}
		tw.Close()
		return buf.Bytes()
	}
	for _, tc := range []struct {
		name string
		b    []byte
		says string
	}{
		{"random bytes", random, "not a tar archive"},
		{"an empty file", nil, "empty tar archive"},
		{"an empty tar", archive(), "empty tar archive"},
		{"a tar without MANIFEST.json", archive("hello.txt", "MANIFEST.json"), `first entry is "hello.txt"`},
		{"a tar of a manifest alone", archive("MANIFEST.json"), "without its last entry SHA256SUMS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := newOpener(t).open(tc.b)
			if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "snapshot save") && !strings.Contains(err.Error(), "save again") {
				t.Fatalf("Open: %v; want %q and what to do", err, tc.says)
			}
		})
	}
	if _, err := snapshot.Open(t.TempDir()); err == nil || !strings.Contains(err.Error(), "is not a meshnode snapshot") {
		t.Fatalf("Open of a directory: %v", err)
	}
}

// TestOpen_NewerFormat: a snapshot of a format newer than this binary reads is refused
// before the rest of it is read, naming the version that reads it.
func TestOpen_NewerFormat(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	man := fmt.Sprintf(`{"kind":%q,"format_version":%d,"meshnode_version":"v3.0.0"}`, snapshot.Kind, snapshot.FormatVersion+1)
	tw.WriteHeader(&tar.Header{Name: snapshot.ManifestEntry, Mode: 0o600, Size: int64(len(man)), Typeflag: tar.TypeReg})
	tw.Write([]byte(man))
	// What follows is a later format's business: here, a header this format would refuse.
	buf.Write(bytes.Repeat([]byte{'?'}, 512))
	err := newOpener(t).open(buf.Bytes())
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("format %d", snapshot.FormatVersion+1)) || !strings.Contains(err.Error(), "use meshnode v3.0.0 or newer") {
		t.Fatalf("Open of a newer format: %v", err)
	}
}
