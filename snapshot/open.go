package snapshot

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// maxSmallEntry bounds what Open reads into memory: the manifest and SHA256SUMS. A
// manifest of ten thousand streams is a few MiB.
const maxSmallEntry = 64 << 20

// trailer is the size of the end of a tar archive: two zero blocks.
const trailer = 2 * 512

// Reader is a snapshot file Open has checked whole.
type Reader struct {
	path    string
	f       *os.File
	man     Manifest
	manSum  string           // the manifest entry's SHA-256, hex
	offsets map[string]int64 // where each entry's data begins in the file
}

// entry is one entry as Open read it.
type entry struct {
	name   string
	offset int64 // where its data begins
	size   int64
	sum    string // SHA-256, hex
	data   []byte // the manifest's and SHA256SUMS's; nil for the others
}

// end is where e's data ends in the file.
func (e entry) end() int64 { return e.offset + e.size }

// Open opens the snapshot at path and checks all of it before it returns: that it is a
// meshnode snapshot, of a format this binary reads, complete, with every entry's checksum
// matching and the manifest agreeing with the entries. Close it when done.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open the snapshot: %w", err)
	}
	r, err := check(path, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// foreign is the error of a file that is no meshnode snapshot.
func foreign(path, why string) error {
	return fmt.Errorf("%s is not a meshnode snapshot: %s; name a file `meshnode snapshot save` wrote", path, why)
}

// truncated is the error of a snapshot cut short.
func truncated(path, where string) error {
	return fmt.Errorf("%s is a truncated meshnode snapshot: it ends %s (a copy cut short, or a save that did not finish); use another copy, or save again", path, where)
}

// damaged is the error of a snapshot some of whose bytes changed since it was written.
func damaged(path, what string) error {
	return fmt.Errorf("%s is a damaged meshnode snapshot: %s, so bytes changed since it was saved; use another copy, or save again", path, what)
}

// check reads the whole of f as a snapshot.
func check(path string, f *os.File) (*Reader, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open the snapshot: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, foreign(path, "it is not a regular file")
	}
	pos := &position{r: bufio.NewReaderSize(f, 256<<10)}
	tr := tar.NewReader(pos)
	var entries []entry
	// Bytes between entries (tar pads each entry's data to a 512-byte block) are checked
	// zero, as the archive's end is: a header carries tar's checksum, data SHA256SUMS's, so
	// no byte of the file goes unchecked. (Save's names are short enough for plain ustar
	// headers; a PAX record's padding would be the one exception.)
	var padding [][2]int64
	for {
		hdr, err := tr.Next()
		after := "at its start"
		if len(entries) > 0 {
			after = "after entry " + entries[len(entries)-1].name
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			if len(entries) == 0 {
				return nil, foreign(path, "it is not a tar archive (too short)")
			}
			return nil, truncated(path, "within the header "+after)
		}
		if err != nil {
			if len(entries) == 0 {
				return nil, foreign(path, fmt.Sprintf("it is not a tar archive (%v)", err))
			}
			return nil, damaged(path, fmt.Sprintf("the tar header %s does not read (%v)", after, err))
		}
		if len(entries) == 0 && hdr.Name != ManifestEntry {
			return nil, foreign(path, fmt.Sprintf("its first entry is %q, not %s", hdr.Name, ManifestEntry))
		}
		if hdr.Typeflag != tar.TypeReg || hdr.Size < 0 {
			return nil, damaged(path, fmt.Sprintf("entry %q is not a regular file", hdr.Name))
		}
		e := entry{name: hdr.Name, offset: pos.n, size: hdr.Size}
		if len(entries) > 0 {
			end := entries[len(entries)-1].end()
			padding = append(padding, [2]int64{end, roundBlock(end)})
		}
		h := sha256.New()
		var w io.Writer = h
		var small bytes.Buffer
		if e.name == ManifestEntry || e.name == SumsEntry {
			if e.size > maxSmallEntry {
				return nil, damaged(path, fmt.Sprintf("entry %s is %d bytes, more than the %d any snapshot writes", e.name, e.size, maxSmallEntry))
			}
			w = io.MultiWriter(h, &small)
		}
		if _, err := io.Copy(w, tr); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, truncated(path, "within entry "+e.name)
			}
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		e.sum = hex.EncodeToString(h.Sum(nil))
		e.data = small.Bytes()
		entries = append(entries, e)
		if len(entries) == 1 {
			if err := checkVersion(path, e.data); err != nil {
				return nil, err
			}
		}
	}
	if len(entries) == 0 {
		return nil, foreign(path, "it is an empty tar archive")
	}
	last := entries[len(entries)-1]
	if last.name != SumsEntry {
		return nil, truncated(path, "after entry "+last.name+", without its last entry "+SumsEntry)
	}
	if err := checkSums(path, entries); err != nil {
		return nil, err
	}
	// What follows the last entry's data: its padding, then the two zero blocks that end
	// the archive (tar.Reader reads neither to the end).
	padding = append(padding, [2]int64{last.end(), fi.Size()})
	if fi.Size() < roundBlock(last.end())+trailer {
		return nil, truncated(path, "within the end of the archive, after its last entry "+SumsEntry)
	}
	for _, p := range padding {
		if err := checkZero(path, f, p[0], p[1]); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		if err := checkChecksumEnd(path, f, e); err != nil {
			return nil, err
		}
	}
	var man Manifest
	if err := json.Unmarshal(entries[0].data, &man); err != nil {
		return nil, foreign(path, fmt.Sprintf("its %s does not read (%v)", ManifestEntry, err))
	}
	if man.Kind != Kind {
		return nil, foreign(path, fmt.Sprintf("its %s is of kind %q, not %q", ManifestEntry, man.Kind, Kind))
	}
	r := &Reader{path: path, f: f, man: man, manSum: entries[0].sum, offsets: map[string]int64{}}
	if err := r.checkStreams(entries); err != nil {
		return nil, err
	}
	return r, nil
}

// checkVersion refuses a snapshot of a newer format, before reading on: a newer format may
// lay out the rest differently. A manifest that does not read is judged once the rest is
// read (a changed byte in it is told by SHA256SUMS).
func checkVersion(path string, data []byte) error {
	var head struct {
		Kind            string `json:"kind"`
		FormatVersion   int    `json:"format_version"`
		MeshnodeVersion string `json:"meshnode_version"`
	}
	if json.Unmarshal(data, &head) != nil || head.Kind != Kind || head.FormatVersion <= FormatVersion {
		return nil
	}
	return fmt.Errorf("%s is a meshnode snapshot of format %d, written by meshnode %s; this meshnode reads format %d and older: use meshnode %s or newer to read it",
		path, head.FormatVersion, head.MeshnodeVersion, FormatVersion, head.MeshnodeVersion)
}

// checkSums checks every entry against SHA256SUMS, and SHA256SUMS against its own line.
func checkSums(path string, entries []entry) error {
	sums := entries[len(entries)-1].data
	body, self, ok := cutLastLine(sums)
	if !ok || self != fmt.Sprintf("%x  %s", sha256.Sum256(body), SumsEntry) {
		return damaged(path, "entry "+SumsEntry+"'s own checksum differs")
	}
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			return damaged(path, fmt.Sprintf("entry %s holds the line %q", SumsEntry, line))
		}
		want[name] = sum
	}
	for _, e := range entries[:len(entries)-1] {
		sum, ok := want[e.name]
		if !ok {
			return damaged(path, fmt.Sprintf("entry %q is not in %s", e.name, SumsEntry))
		}
		if sum != e.sum {
			return damaged(path, fmt.Sprintf("entry %s's SHA-256 differs from the one in %s", e.name, SumsEntry))
		}
		delete(want, e.name)
	}
	for name := range want {
		return truncated(path, fmt.Sprintf("without entry %s, which %s lists", name, SumsEntry))
	}
	return nil
}

// cutLastLine splits text ending in a newline into what precedes its last line, and that
// line without its newline.
func cutLastLine(text []byte) (body []byte, last string, ok bool) {
	if !bytes.HasSuffix(text, []byte("\n")) {
		return nil, "", false
	}
	i := bytes.LastIndexByte(text[:len(text)-1], '\n')
	return text[:i+1], string(text[i+1 : len(text)-1]), true
}

// checkZero checks that f's bytes from..to are zero.
func checkZero(path string, f *os.File, from, to int64) error {
	if to <= from {
		return nil
	}
	buf := make([]byte, min(to-from, 64<<10))
	for at := from; at < to; {
		n := min(int64(len(buf)), to-at)
		if _, err := f.ReadAt(buf[:n], at); err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		if i := bytes.IndexFunc(buf[:n], func(r rune) bool { return r != 0 }); i >= 0 {
			return damaged(path, fmt.Sprintf("byte %d, in the padding between entries or the end of the archive, is not zero", at+int64(i)))
		}
		at += n
	}
	return nil
}

// checksumEnd is where, in a ustar header, the byte after its checksum's NUL lies: tar's own
// check skips it (the checksum field is summed as spaces, and read up to its NUL), and
// archive/tar always writes a space there.
const checksumEnd = 155

// checkChecksumEnd checks the one byte of e's header that tar's checksum does not cover. A
// ustar header is the block just before its entry's data (PAX records, when there are any,
// come before it).
func checkChecksumEnd(path string, f *os.File, e entry) error {
	at := e.offset - 512 + checksumEnd
	b := []byte{0}
	if _, err := f.ReadAt(b, at); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if b[0] != ' ' {
		return damaged(path, fmt.Sprintf("byte %d, in the tar header of entry %s, is %#x where archive/tar writes a space", at, e.name, b[0]))
	}
	return nil
}

// roundBlock rounds n up to tar's 512-byte block.
func roundBlock(n int64) int64 { return (n + 511) &^ 511 }

// checkStreams checks the manifest against the entries: one per stream, of the size and
// checksum the manifest says, and nothing else.
func (r *Reader) checkStreams(entries []entry) error {
	byName := map[string]entry{}
	for _, e := range entries[1 : len(entries)-1] {
		byName[e.name] = e
	}
	for _, s := range r.man.Streams {
		e, ok := byName[s.Entry]
		switch {
		case s.Entry != entryName(s.Name()):
			return damaged(r.path, fmt.Sprintf("the manifest puts stream %s in entry %q, not %s", s.Name(), s.Entry, entryName(s.Name())))
		case !ok:
			return truncated(r.path, fmt.Sprintf("without entry %s, which the manifest lists", s.Entry))
		case e.size != s.Size || e.sum != s.SHA256:
			return damaged(r.path, fmt.Sprintf("entry %s is not the one the manifest describes (%d bytes, SHA-256 %s)", s.Entry, s.Size, s.SHA256))
		}
		r.offsets[s.Entry] = e.offset
		delete(byName, s.Entry)
	}
	for name := range byName {
		return damaged(r.path, fmt.Sprintf("entry %q is in no stream of the manifest", name))
	}
	return nil
}

// Manifest is what the snapshot holds.
func (r *Reader) Manifest() Manifest { return r.man }

// Close closes the file.
func (r *Reader) Close() error { return r.f.Close() }

// Unpack writes stream name's snapshot to dir/<name>.snap, where streammove.Restore reads
// it, checking its SHA-256 again (the file may have changed since Open).
func (r *Reader) Unpack(name, dir string) error {
	var s *Stream
	for i := range r.man.Streams {
		if r.man.Streams[i].Name() == name {
			s = &r.man.Streams[i]
		}
	}
	if s == nil {
		return fmt.Errorf("snapshot %s holds no stream %s: `meshnode snapshot inspect %s` lists its streams", r.path, name, r.path)
	}
	out := filepath.Join(dir, name+".snap")
	f, err := os.OpenFile(out, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), io.NewSectionReader(r.f, r.offsets[s.Entry], s.Size))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && hex.EncodeToString(h.Sum(nil)) != s.SHA256 {
		err = damaged(r.path, "entry "+s.Entry+"'s SHA-256 differs from the manifest's now (it passed when opened)")
	}
	if err != nil {
		os.Remove(out)
		return fmt.Errorf("unpack stream %s: %w", name, err)
	}
	return nil
}

// position counts the bytes read through it: where tar.Reader is in the file.
type position struct {
	r io.Reader
	n int64
}

func (p *position) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	return n, err
}
