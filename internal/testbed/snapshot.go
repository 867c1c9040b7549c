package testbed

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"
)

// SnapshotBytes is every byte of the meshnode snapshot file at path as a restore reads it:
// the manifest and SHA256SUMS as they are, each stream's snapshot (nats-server's archive of
// the stream: its state, then each message's subject, headers and body) decompressed (s2) —
// what a scan for plaintext secrets or seeds must read.
func SnapshotBytes(tb testing.TB, path string) []byte {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var all bytes.Buffer
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return all.Bytes()
		}
		if err != nil {
			tb.Fatal(err)
		}
		var r io.Reader = tr
		if strings.HasSuffix(hdr.Name, ".snap") {
			r = s2.NewReader(tr)
		}
		if _, err := io.Copy(&all, r); err != nil {
			tb.Fatalf("%s: %v", hdr.Name, err)
		}
	}
}
