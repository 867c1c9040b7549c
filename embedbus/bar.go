package embedbus

import (
	"sync"
	"time"

	"github.com/meshnode/meshnode/floodwatch"

	"github.com/nats-io/nats-server/v2/server"
)

// bars are the keys refused at the door until a time: a module the node disconnected for
// flooding. Checked before the nonce's signature, so a barred client's reconnects cost a
// map lookup each, not a signature verification.
type bars struct {
	mu sync.Mutex
	m  map[string]time.Time
}

// barred reports whether key is barred now, forgetting its bar once it has ended.
func (b *bars) barred(key string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	until, ok := b.m[key]
	if ok && !now.Before(until) {
		delete(b.m, key)
		return false
	}
	return ok
}

func (b *bars) set(key string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]time.Time{}
	}
	b.m[key] = until
}

// Bar disconnects every connection of publicKey and refuses its connects until until: how
// the node ends a flood from a module that keeps on past its refusals. It returns how many
// connections it closed.
func (b *Bus) Bar(publicKey string, until time.Time) int {
	b.auth.bars.set(publicKey, until)
	return b.Kick(publicKey)
}

// ClientStats lists the open client connections with their counts, in-process: one Connz
// of the server, which copies every connection's counters under its lock.
func (b *Bus) ClientStats() []floodwatch.ConnStat {
	var out []floodwatch.ConnStat
	b.eachConn(server.ConnzOptions{Username: true}, func(ci *server.ConnInfo) {
		out = append(out, floodwatch.ConnStat{ID: ci.Cid, Key: ci.AuthorizedUser, InMsgs: ci.InMsgs, OutMsgs: ci.OutMsgs})
	})
	return out
}

// ClientInMsgs is how many messages the modules' account has received from its client
// connections on this server: one counter, read without listing a connection, for a rate
// monitor to tell whether any connection may have sent fast enough to be worth a
// ClientStats.
func (b *Bus) ClientInMsgs() int64 {
	st, err := b.srv.AccountStatz(&server.AccountStatzOptions{Accounts: []string{server.DEFAULT_GLOBAL_ACCOUNT}, IncludeUnused: true})
	if err != nil || len(st.Accounts) == 0 {
		return 0
	}
	r := st.Accounts[0].Received
	n := r.Msgs
	for _, other := range []*server.MsgBytes{r.Routes, r.Gateways, r.Leafs} {
		if other != nil {
			n -= other.Msgs
		}
	}
	return n
}

// KeyOf is the key an open client connection authenticated with, by its connection id.
func (b *Bus) KeyOf(cid uint64) (key string, ok bool) { return keyOf(b.srv, cid) }

// keyOf is Bus.KeyOf on srv: the logger asks it before the Bus exists.
func keyOf(srv *server.Server, cid uint64) (key string, ok bool) {
	eachConn(srv, server.ConnzOptions{CID: cid, Username: true}, func(ci *server.ConnInfo) {
		key, ok = ci.AuthorizedUser, ci.AuthorizedUser != ""
	})
	return key, ok
}
