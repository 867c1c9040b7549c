package audit

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/meshnode/meshnode/api"
)

// A record is stored in a compact binary encoding: compactFormat, then its fields in a
// fixed order (numbers as varints, strings and bytes with their length), then its hash as
// the last 32 bytes. The hash is SHA-256 over everything before it, so verify checks the
// stored bytes as they are, and writing a record encodes it once. A record that begins with
// '{' is the JSON of a log written before this encoding: read, and verified, as it was
// hashed then (Record.computeHash).
const compactFormat = 0x02

// The versions of the audit record's encoding, as `meshnode version` reports them: the
// compact encoding (its leading byte) is written, and a record in JSON, the first encoding,
// is still read and verified.
const (
	// RecordFormat is the encoding this binary writes: the compact one.
	RecordFormat = compactFormat
	// OldestRecordFormat is the oldest encoding this binary reads: JSON.
	OldestRecordFormat = 1
)

// prevText is the flag of a record whose link is not a hash (a head damaged on disk): the
// link is kept as text.
const prevText = 4

// hashLen is the length of a compact record's hash, and of its link to the previous one.
const hashLen = sha256.Size

// encodeRecord is r's stored form, with its hash, which it also sets in r.
func encodeRecord(r *api.AuditRecord) []byte {
	var flags byte
	prev, err := hex.DecodeString(r.Prev)
	if err != nil || len(prev) != 0 && len(prev) != hashLen {
		// A head damaged on disk: the record links to it as it reads, verify reports the
		// broken link there, and the log goes on.
		prev, flags = []byte(r.Prev), flags|prevText
	}
	b := make([]byte, 0, 128+len(r.Subject)+len(r.Body)+64*len(r.Headers))
	b = append(b, compactFormat)
	b = binary.AppendUvarint(b, r.N)
	b = binary.AppendUvarint(b, r.Seq)
	b = appendString(b, r.Subject)
	b = binary.AppendUvarint(b, uint64(len(r.Headers)))
	keys := make([]string, 0, len(r.Headers))
	for k := range r.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(r.Headers[k])))
		for _, v := range r.Headers[k] {
			b = appendString(b, v)
		}
	}
	b = appendString(b, string(r.Body))
	b = binary.AppendVarint(b, r.Received.UnixNano())
	b = appendString(b, r.EventID)
	b = appendString(b, r.Source)
	if r.Signed {
		flags |= 1
	}
	if r.SourceMatches {
		flags |= 2
	}
	b = append(b, flags)
	b = appendString(b, r.SignatureError)
	b = binary.AppendUvarint(b, r.ReusedID)
	b = appendString(b, string(prev))
	sum := sha256.Sum256(b)
	r.Hash = hex.EncodeToString(sum[:])
	return append(b, sum[:]...)
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// errDamaged: a stored record does not decode.
var errDamaged = errors.New("the record is damaged: it does not decode")

// decodeRecord reads a stored record, in either form. For a compact record, hashOK says
// whether its bytes still match its hash; for a JSON one, whether its JSON does.
func decodeRecord(raw []byte) (r api.AuditRecord, hashOK bool, err error) {
	if len(raw) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, &r); err != nil {
			return api.AuditRecord{}, false, err
		}
		return r, computeHash(r) == r.Hash, nil
	}
	if len(raw) < 1+hashLen || raw[0] != compactFormat {
		return api.AuditRecord{}, false, errDamaged
	}
	body, sum := raw[:len(raw)-hashLen], raw[len(raw)-hashLen:]
	d := decoder{b: body[1:]}
	r.N = d.uvarint()
	r.Seq = d.uvarint()
	r.Subject = d.string()
	if n := d.uvarint(); n > 0 && d.err == nil {
		if n > uint64(len(d.b))/2 { // a header is two bytes at least
			return api.AuditRecord{}, false, errDamaged
		}
		r.Headers = make(map[string][]string, n)
		for range n {
			k := d.string()
			vn := d.uvarint()
			if vn > uint64(len(d.b)) { // a value is a byte at least
				return api.AuditRecord{}, false, errDamaged
			}
			vs := make([]string, 0, vn)
			for range vn {
				vs = append(vs, d.string())
			}
			r.Headers[k] = vs
		}
	}
	if body := d.string(); body != "" {
		r.Body = []byte(body)
	}
	r.Received = time.Unix(0, d.varint()).UTC()
	r.EventID = d.string()
	r.Source = d.string()
	flags := d.byte()
	r.Signed, r.SourceMatches = flags&1 != 0, flags&2 != 0
	r.SignatureError = d.string()
	r.ReusedID = d.uvarint()
	if prev := d.string(); flags&prevText != 0 {
		r.Prev = prev
	} else if prev != "" {
		r.Prev = hex.EncodeToString([]byte(prev))
	}
	if d.err != nil || len(d.b) != 0 {
		return api.AuditRecord{}, false, errDamaged
	}
	r.Hash = hex.EncodeToString(sum)
	got := sha256.Sum256(body)
	return r, string(got[:]) == string(sum), nil
}

// decoder reads a compact record's fields; the first error sticks, and every read after it
// returns a zero value.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errDamaged
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errDamaged
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = errDamaged
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = errDamaged
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
