package testbed

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// PullLoser is a TCP proxy between a NATS client and a server that drops the client's
// JetStream pull requests (a PUB or HPUB to $JS.API.CONSUMER.MSG.NEXT.…) while told to, and
// passes everything else. It plays a pull lost without a word — sent while a clustered
// consumer elects a leader, or waiting at a leader killed or cut off — which the client can
// notice only by the heartbeats that stop coming.
type PullLoser struct {
	addr   string
	losing atomic.Bool
	lost   atomic.Int64
}

// NewPullLoser starts a PullLoser in front of the server at serverAddr (host:port). It and
// its connections close when the test ends, after the test's own cleanups registered later
// (close the client's connection in one of those).
func NewPullLoser(tb testing.TB, serverAddr string) *PullLoser {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen for the pull-losing proxy: %v", err)
	}
	p := &PullLoser{addr: l.Addr().String()}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	tb.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close() // a client still connected would keep its copies running
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", serverAddr)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Go(func() {
				io.Copy(c, s)
				c.Close()
			})
			wg.Go(func() {
				p.forward(s, c)
				s.Close()
			})
		}
	})
	return p
}

// Addr is the proxy's address (host:port): connect the client to nats://Addr().
func (p *PullLoser) Addr() string { return p.addr }

// Lose sets whether pull requests are dropped from now on.
func (p *PullLoser) Lose(on bool) { p.losing.Store(on) }

// Lost is how many pull requests were dropped so far.
func (p *PullLoser) Lost() int64 { return p.lost.Load() }

// forward copies the client's protocol to the server one operation at a time, leaving out a
// pull request while losing.
func (p *PullLoser) forward(to io.Writer, from io.Reader) {
	r := bufio.NewReader(from)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		op := line
		f := strings.Fields(line)
		if len(f) >= 3 && (strings.EqualFold(f[0], "PUB") || strings.EqualFold(f[0], "HPUB")) {
			n, _ := strconv.Atoi(f[len(f)-1])
			body := make([]byte, n+2) // the payload and its CRLF
			if _, err := io.ReadFull(r, body); err != nil {
				return
			}
			op += string(body)
			if p.losing.Load() && strings.HasPrefix(f[1], "$JS.API.CONSUMER.MSG.NEXT.") {
				p.lost.Add(1)
				continue
			}
		}
		if _, err := io.WriteString(to, op); err != nil {
			return
		}
	}
}
