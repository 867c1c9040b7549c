package admit

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nkeys"
)

// wire is the admitter's connection to its node's server: a client of the NATS protocol of its
// own, for the one thing nats.go cannot do — pass a message's header block on as it came.
// nats.go decodes every header block it receives into a map and encodes it again to publish:
// 7–9 µs of CPU an event through the admitter, against 2.8–3.2 µs when the block is passed
// through as bytes (measured on the 2-core machine the budget of 5 µs is set on). And the
// stream stores, byte for byte, what the module sent.
//
// It speaks only what the admitter needs of the client protocol
// (docs.nats.io/reference/reference-protocols/nats-protocol): INFO, CONNECT signed with an
// nkey over the server's nonce, one SUB in a queue group, PING/PONG, HMSG and MSG in, HPUB and
// PUB out. +OK and later INFOs are ignored; an -ERR (a publish its permissions deny) is
// reported to onErr and the connection goes on, as the server's does.
type wire struct {
	conn  net.Conn
	r     *bufio.Reader
	w     *bufio.Writer
	onErr func(string)
	buf   []byte // the last message's header block and body, reused
	reply []byte // the last message's reply subject, reused
	num   []byte // a number being written, reused
	// subjects are the subjects read lately, each allocated once: a module emits a handful
	// of subjects many times. Emptied when it holds subjectsKept, so that a sender of ever
	// new subjects costs an allocation each, as without it, and no more memory.
	subjects map[string]string
}

// subjectsKept is how many subjects the wire keeps allocated.
const subjectsKept = 4096

// msg is one message the server delivered. Its slices are the wire's: valid until its next
// call to next.
type msg struct {
	subject string
	reply   []byte // nil: none
	hdr     []byte // the header block as sent ("NATS/1.0\r\n…\r\n\r\n"); nil: none
	data    []byte
}

// wireBuffer is the size of the wire's read and write buffers: many events a read, many a
// write, under load.
const wireBuffer = 64 << 10

// dialWire connects on conn, authenticating with key (nil: no authentication), and
// subscribes to subject in queue.
func dialWire(conn net.Conn, key nkeys.KeyPair, name, subject, queue string, onErr func(string)) (*wire, error) {
	c := &wire{conn: conn, r: bufio.NewReaderSize(conn, wireBuffer), w: bufio.NewWriterSize(conn, wireBuffer), onErr: onErr}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := c.r.ReadSlice('\n')
	if err != nil || !bytes.HasPrefix(line, []byte("INFO ")) {
		conn.Close()
		return nil, fmt.Errorf("the server's greeting %q: %v", line, err)
	}
	var info struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(line[5:]), &info); err != nil {
		conn.Close()
		return nil, fmt.Errorf("the server's INFO: %w", err)
	}
	connect := map[string]any{"verbose": false, "pedantic": false, "headers": true, "no_responders": true,
		"protocol": 1, "name": name, "lang": "meshnode-admit", "version": "1"}
	if key != nil {
		sig, err := key.Sign([]byte(info.Nonce))
		if err != nil {
			conn.Close()
			return nil, err
		}
		pub, _ := key.PublicKey()
		connect["nkey"], connect["sig"] = pub, base64.RawURLEncoding.EncodeToString(sig)
	}
	b, _ := json.Marshal(connect)
	fmt.Fprintf(c.w, "CONNECT %s\r\nSUB %s %s 1\r\nPING\r\n", b, subject, queue)
	if err := c.w.Flush(); err != nil {
		conn.Close()
		return nil, err
	}
	// The PONG answers the PING after the CONNECT and the SUB: both are in effect.
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("waiting for the server to take the connection: %w", err)
		}
		switch {
		case bytes.HasPrefix(line, []byte("PONG")):
			conn.SetDeadline(time.Time{})
			return c, nil
		case bytes.HasPrefix(line, []byte("-ERR")):
			conn.Close()
			return nil, fmt.Errorf("the server refused the connection: %s", bytes.TrimSpace(line[4:]))
		}
	}
}

// errProtocol is a line from the server the wire cannot read.
var errProtocol = errors.New("unreadable line from the server")

// next returns the next message the server delivers, answering its PINGs meanwhile.
func (c *wire) next() (msg, error) {
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return msg{}, err
		}
		switch {
		case bytes.HasPrefix(line, []byte("HMSG ")):
			return c.read(line[5:], true)
		case bytes.HasPrefix(line, []byte("MSG ")):
			return c.read(line[4:], false)
		case bytes.HasPrefix(line, []byte("PING")):
			c.w.WriteString("PONG\r\n")
			if err := c.w.Flush(); err != nil {
				return msg{}, err
			}
		case bytes.HasPrefix(line, []byte("-ERR")):
			c.onErr(string(bytes.TrimSpace(line[4:])))
		}
	}
}

// read reads a message whose control line's arguments are args: "subject sid [reply] [hdr]
// total". It allocates nothing but a subject it has not kept: it runs for every event.
func (c *wire) read(args []byte, headers bool) (msg, error) {
	var f [5][]byte
	n := 0
	for rest := bytes.TrimRight(args, "\r\n"); len(rest) > 0 && n < len(f); {
		rest = bytes.TrimLeft(rest, " \t")
		i := bytes.IndexAny(rest, " \t")
		if i < 0 {
			i = len(rest)
		}
		if i > 0 {
			f[n], n = rest[:i], n+1
		}
		rest = rest[i:]
	}
	want := 3
	if headers {
		want = 4
	}
	if n != want && n != want+1 {
		return msg{}, fmt.Errorf("%w: %q", errProtocol, args)
	}
	m := msg{subject: c.subject(f[0])}
	if n == want+1 {
		c.reply = append(c.reply[:0], f[2]...) // the line is the reader's, overwritten by the next read
		m.reply = c.reply
	}
	total, ok := size(f[n-1])
	if !ok {
		return msg{}, fmt.Errorf("%w: %q", errProtocol, args)
	}
	hdr := 0
	if headers {
		if hdr, ok = size(f[n-2]); !ok || hdr > total {
			return msg{}, fmt.Errorf("%w: %q", errProtocol, args)
		}
	}
	if cap(c.buf) < total+2 {
		c.buf = make([]byte, total+2)
	}
	c.buf = c.buf[:total+2]
	if _, err := io.ReadFull(c.r, c.buf); err != nil {
		return msg{}, err
	}
	if headers {
		m.hdr = c.buf[:hdr]
	}
	m.data = c.buf[hdr:total]
	return m, nil
}

// subject is b as a string, allocated once while it is kept.
func (c *wire) subject(b []byte) string {
	if s, ok := c.subjects[string(b)]; ok { // a lookup by a converted slice allocates nothing
		return s
	}
	if len(c.subjects) >= subjectsKept || c.subjects == nil {
		c.subjects = make(map[string]string, 64)
	}
	s := string(b)
	c.subjects[s] = s
	return s
}

// size reads a byte count of the protocol: decimal digits, at most a gigabyte.
func size(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 10 {
		return 0, false
	}
	n := 0
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int(d-'0')
	}
	return n, n <= 1<<30
}

// publish writes a message on subject, with reply (nil: none) and hdr (nil: none); it is sent
// at the next flush.
func (c *wire) publish(subject string, reply, hdr, data []byte) {
	if hdr != nil {
		c.w.WriteString("HPUB ")
	} else {
		c.w.WriteString("PUB ")
	}
	c.w.WriteString(subject)
	c.w.WriteByte(' ')
	if reply != nil {
		c.w.Write(reply)
		c.w.WriteByte(' ')
	}
	if hdr != nil {
		c.num = strconv.AppendInt(c.num[:0], int64(len(hdr)), 10)
		c.w.Write(c.num)
		c.w.WriteByte(' ')
	}
	c.num = strconv.AppendInt(c.num[:0], int64(len(hdr)+len(data)), 10)
	c.w.Write(c.num)
	c.w.WriteString("\r\n")
	c.w.Write(hdr)
	c.w.Write(data)
	c.w.WriteString("\r\n")
}

// flushIfIdle sends what was published once nothing more waits to be read: a burst goes out
// in few writes, a lone event at once.
func (c *wire) flushIfIdle() error {
	if c.r.Buffered() > 0 {
		return nil
	}
	return c.w.Flush()
}

// close ends the connection; next returns an error.
func (c *wire) close() error { return c.conn.Close() }

// headerValue returns the first value of name in a header block, and whether the block is
// well formed: "NATS/1.0" and a line per header, each "name: value", ended by an empty line,
// no bare line feed. A block nats.go could not decode is not well formed: a consumer would be
// handed an event without its envelope.
func headerValue(block []byte, name string) (value []byte, ok bool) {
	rest, found := bytes.CutPrefix(block, []byte("NATS/1.0"))
	if !found {
		return nil, false
	}
	_, rest, found = bytes.Cut(rest, []byte("\r\n")) // a status may follow the version
	if !found {
		return nil, false
	}
	for {
		line, after, found := bytes.Cut(rest, []byte("\r\n"))
		if !found {
			return nil, false
		}
		if len(line) == 0 {
			if len(after) != 0 {
				return nil, false
			}
			return value, true
		}
		if bytes.IndexByte(line, '\n') >= 0 {
			return nil, false
		}
		k, v, found := bytes.Cut(line, []byte(":"))
		if !found || len(k) == 0 {
			return nil, false
		}
		if value == nil && string(k) == name {
			value = bytes.TrimSpace(v)
		}
		rest = after
	}
}
